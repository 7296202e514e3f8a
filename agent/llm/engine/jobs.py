"""The job queue: one `complete` call in flight (`Job`), and the queue that carries jobs to the model thread.

A job is made on the event loop and answered from the model thread: its text pieces and its result travel back
through `call_soon_threadsafe`, so its caller's callbacks and future are only ever touched on the event loop.

The queue keeps its jobs in arrival order but does not decide who goes first: the admission policy
(admission.py) looks at the waiting jobs (`waiting`) and takes the ones it chooses (`take`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from agent.grammar import Grammar
from agent.llm.base import CancelToken, Completion, Message, Priority, TextSink

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
    user_key: str = ""  # whose call it is: admission shares the rows fairly among the keys waiting
    priority: Priority = Priority.NORMAL  # LOW: nobody waits for it; it runs only while no NORMAL job waits or runs

    @property
    def low(self) -> bool:
        """Whether this is a background job (a summary), admitted only where no person's job needs the room."""
        return self.priority == Priority.LOW

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


class JobQueue:
    """Jobs waiting for the model thread, in arrival order; safe to use from any thread."""

    def __init__(self) -> None:
        self._jobs: list[Job] = []
        self._woken = False
        self._changed = threading.Condition()

    def put(self, job: Job) -> None:
        """Queue `job` (called on the event loop)."""
        with self._changed:
            self._jobs.append(job)
            self._changed.notify_all()

    def wake(self) -> None:
        """Release a model thread waiting in `wait_for`, now and from now on (the engine is closing)."""
        with self._changed:
            self._woken = True
            self._changed.notify_all()

    def wait_for(self, ready: Callable[[list[Job]], bool], timeout: float | None = None) -> bool:
        """Wait until `ready(waiting jobs)` holds, up to `timeout` seconds (None: as long as it takes); False when
        it does not hold by then, or the queue was woken."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self._woken and not ready(self._jobs):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left)
            return not self._woken

    def waiting(self) -> list[Job]:
        """The jobs waiting now, oldest first (a copy)."""
        with self._changed:
            return list(self._jobs)

    def take(self, chosen: Sequence[Job]) -> None:
        """Remove the `chosen` jobs (taken into a batch) from the queue."""
        taken = {id(job) for job in chosen}
        with self._changed:
            self._jobs = [job for job in self._jobs if id(job) not in taken]

    def empty(self) -> bool:
        """Whether no job waits."""
        with self._changed:
            return not self._jobs

    def size(self) -> int:
        """How many jobs wait."""
        with self._changed:
            return len(self._jobs)

    def fail_all(self, error: BaseException) -> None:
        """Answer every waiting job with `error`, and empty the queue."""
        with self._changed:
            jobs, self._jobs = self._jobs, []
        for job in jobs:
            job.settle(error=error)
