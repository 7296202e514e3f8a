"""The job queue: one `complete` call in flight (`Job`), and the queue that carries jobs to the model thread.

A job is made on the event loop and answered from the model thread: its text pieces and its result travel back
through `call_soon_threadsafe`, so its caller's callbacks and future are only ever touched on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from agent.grammar import Grammar
from agent.llm.base import CancelToken, Completion, Message, TextSink

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One `complete` call in flight: the request, where its answer goes, and how to cancel it."""

    messages: Sequence[Message]
    stop: tuple[str, ...]
    max_new_tokens: int
    tools: list[dict[str, Any]] | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    grammar: Grammar | None = None
    caller_cancel: CancelToken | None = None
    on_text: TextSink | None = None  # called on the event loop with each piece of new text
    own_cancel: CancelToken = field(default_factory=CancelToken)
    submitted_at: float = field(default_factory=time.monotonic)

    @property
    def cancelled(self) -> bool:
        """Whether the caller's token or our own (the awaiting task was cancelled, or the engine is closing) is set."""
        return self.own_cancel.cancelled or (self.caller_cancel is not None and self.caller_cancel.cancelled)

    def hand_on(self, text: str) -> None:
        """Pass new text to the caller's `on_text`, on the event loop's own thread (called on the model thread)."""
        try:
            self.loop.call_soon_threadsafe(_take_text, self, text)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    def settle(self, result: Completion | None = None, error: BaseException | None = None) -> None:
        """Resolve the future from the model thread, on the event loop's own thread."""
        try:
            self.loop.call_soon_threadsafe(resolve, self.future, result, error)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _take_text(job: Job, text: str) -> None:
    if job.future.done() or job.on_text is None:  # answered or given up on: late text goes nowhere
        return
    try:
        job.on_text(text)
    except Exception:  # the caller's sink failing must not stop the event loop's other work
        log.warning("the text sink of a model call failed", exc_info=True)


def resolve(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """Settle `future` with `result` or `error` (on the event loop), unless it is settled already."""
    if future.done():  # the awaiting task was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


_WAKE = object()  # queue mark: the model thread stops waiting for jobs (it is closing)


class JobQueue:
    """Jobs waiting for the model thread, first in first out; safe to use from any thread."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()

    def put(self, job: Job) -> None:
        """Queue `job` (called on the event loop)."""
        self._queue.put(job)

    def wake(self) -> None:
        """Release a model thread waiting in `get`: it gets None."""
        self._queue.put(_WAKE)

    def get(self, timeout: float | None = None, block: bool = True) -> Job | None:
        """The oldest job: waiting for one up to `timeout` seconds (None: as long as it takes) when `block`; None
        when none came, or the queue was woken."""
        try:
            item = self._queue.get(timeout=timeout) if block else self._queue.get_nowait()
        except queue.Empty:
            return None
        return None if item is _WAKE else item

    def empty(self) -> bool:
        """Whether no job waits."""
        return self._queue.empty()

    def size(self) -> int:
        """How many jobs wait (a close's wake-up mark may count as one)."""
        return self._queue.qsize()

    def fail_all(self, error: BaseException) -> None:
        """Answer every waiting job with `error`, and empty the queue."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _WAKE:
                item.settle(error=error)
