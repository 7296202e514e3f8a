"""The process's write lock: one transaction at a time on the shared connection, urgent writers first."""

from __future__ import annotations

import asyncio
from collections import deque
from contextlib import asynccontextmanager
from typing import AsyncIterator


class WriteLock:
    """One holder at a time; waiters that are `urgent` get it before the others, each line first come first served."""

    def __init__(self) -> None:
        self._held = False
        self._lines: tuple[deque[asyncio.Future], deque[asyncio.Future]] = (deque(), deque())  # urgent, ordinary

    @asynccontextmanager
    async def hold(self, urgent: bool = False) -> AsyncIterator[None]:
        """Hold the lock for the block."""
        await self._acquire(urgent)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, urgent: bool) -> None:
        if not self._held:  # free, so nobody waits: a release hands the lock straight to the next waiter
            self._held = True
            return
        turn = asyncio.get_running_loop().create_future()
        self._lines[0 if urgent else 1].append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release()  # handed over just as we were cancelled: pass it on
            raise

    def _release(self) -> None:
        for line in self._lines:
            while line:
                turn = line.popleft()
                if not turn.done():  # a cancelled waiter's turn is skipped
                    turn.set_result(None)  # handed over: the lock stays held
                    return
        self._held = False
