"""The model thread: the one thread that owns the model and its tokenizer, and batches requests across chats.

    event loop                               model thread
    ──────────                               ────────────
    submit(Job) ──── queue.Queue ──────────▶ take every pending job (up to batch_size)
                                             one decode loop for all of them (batching.py), each row
                                             masked by its own grammar (if its caller gave one) and
                                             ending on its own stop strings / token limit / cancel token
    job.on_text ◀─────── call_soon_threadsafe ─ each row's new text as it is generated (if its caller listens)
    await job.future ◀── call_soon_threadsafe ─ settle each job with its Completion or its error

Nothing but this thread touches torch, the model or this tokenizer: HF fast tokenizers raise "Already borrowed"
when one instance is used from two threads, and a blocked event loop would freeze every chat.

A request that arrives during a batch joins at the next step when the batch has room: the batch pauses, its
unfinished rows keep their own KV and go on in the next batch beside the newcomer (batching.py).
Every caller is answered as soon as its own row ends, not when the batch does.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from agent.errors import LLMCancelled, LLMError, LLMOutOfMemory
from agent.grammar import Grammar
from agent.llm.base import CancelToken, Completion, Message, TextSink, trim_at_stop
from agent.llm.batching import BatchRow, generate_rows, render_prompt
from agent.llm.constraints import GrammarEngine, RowGrammar
from agent.llm.drafts import DraftLimits
from agent.llm.prefix_cache import PrefixCache
from agent.llm.text_stream import TextStream

log = logging.getLogger(__name__)

_CLOSE = object()  # queue sentinel: the thread finishes its batch and exits


@dataclass(frozen=True)
class LoadedModel:
    """What the loader hands the model thread: the model, and the tokenizer and grammar engine only it may use."""

    model: Any
    tokenizer: Any
    grammars: GrammarEngine | None = None  # None: grammars are refused (a test double)


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
        """Whether the caller's token or our own (the awaiting task was cancelled, or the worker is closing) is set."""
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
            self.loop.call_soon_threadsafe(_resolve, self.future, result, error)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _take_text(job: Job, text: str) -> None:
    if job.future.done() or job.on_text is None:  # answered or given up on: late text goes nowhere
        return
    try:
        job.on_text(text)
    except Exception:  # the caller's sink failing must not stop the event loop's other work
        log.warning("the text sink of a model call failed", exc_info=True)


def _resolve(future: asyncio.Future, result: Completion | None, error: BaseException | None) -> None:
    if future.done():  # the awaiting task was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class ModelWorker:
    """Owns the model thread: loads the model there, then runs batches of jobs until closed."""

    def __init__(self, load: Callable[[], LoadedModel], *, batch_size: int, batch_wait: float = 0.0,
                 min_new_tokens: int = 0, prefix_cache_bytes: int = 0, drafts: DraftLimits = DraftLimits()):
        self._load = load
        self.batch_size = batch_size
        self.drafts = drafts  # draft tokens a step may check per row and per batch (drafts.py)
        self.batch_wait = batch_wait  # seconds a batch may wait, from its first job's arrival, for more jobs
        # Benchmarks only: force every row to generate at least this many tokens, so runs are comparable.
        self.min_new_tokens = min_new_tokens
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._main, name="model", daemon=True)
        self._loaded: asyncio.Future | None = None
        self._exited: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._current: list[Job] = []
        # Rows paused so that a newcomer could join: they go first into the next batch, each holding its own KV.
        self._paused: list[BatchRow] = []
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self._closing = threading.Event()

    async def start(self) -> LoadedModel:
        """Start the thread, load the model on it, and wait (without blocking the loop) until it is ready."""
        self._loop = asyncio.get_running_loop()
        self._loaded, self._exited = self._loop.create_future(), self._loop.create_future()
        self._thread.start()
        return await self._loaded

    def submit(self, job: Job) -> None:
        """Queue a job for the next batch; called on the event loop."""
        if self._exited is None or self._closing.is_set():
            raise LLMError("the local model is not running (start() was not called, or it has closed)")
        self._jobs.put(job)
        if self._closing.is_set():  # it closed between the check and the put: nobody will take the job now
            job.settle(error=LLMError("the local model is shutting down"))

    async def close(self) -> None:
        """Cancel what is queued or running, and wait for the thread to finish its batch and exit."""
        if self._exited is None or self._exited.done():
            return
        self._closing.set()  # before cancelling: a batch taken meanwhile sees it and is not started
        for job in list(self._current):
            job.own_cancel.cancel()
        self._jobs.put(_CLOSE)  # wakes the thread if it is waiting for work
        await asyncio.shield(self._exited)

    # ── everything below runs on the model thread ────────────────────────────────────────────────────────────

    def _main(self) -> None:
        try:
            loaded = self._load()
        except BaseException as error:  # the loader maps what it can; anything else still reaches start()
            self._signal(self._loaded, None, error)
            self._signal(self._exited, None, None)
            return
        self._signal(self._loaded, loaded, None)
        try:
            self._serve(loaded)
        except BaseException:
            log.exception("the model thread crashed")
            raise
        finally:
            self._stop_serving()

    def _stop_serving(self) -> None:
        """Whatever ended the thread, nobody may be left waiting (settling a settled job is a no-op)."""
        self._closing.set()
        stopped = LLMError("the local model has stopped")
        _fail_jobs(self._current, stopped)
        self._fail_queued(stopped)
        self._signal(self._exited, None, None)

    def _signal(self, future: asyncio.Future | None, result: Any, error: BaseException | None) -> None:
        if future is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_resolve, future, result, error)

    def _serve(self, loaded: LoadedModel) -> None:
        while True:
            resumed = self._paused
            self._paused = []
            self._current = [row.owner for row in resumed] + self._next_batch(room=self.batch_size - len(resumed),
                                                                              block=not resumed)
            if self._closing.is_set():
                closed = LLMError("the local model is shutting down")
                _fail_jobs(self._current, closed)
                self._fail_queued(closed)
                return
            self._run_batch(loaded, resumed, self._current[len(resumed):])
            self._current = []

    def _next_batch(self, room: int, block: bool = True) -> list[Job]:
        """Wait for one job (when `block`), then take what else arrives within `batch_wait` of it, up to `room`.

        Turns that start together reach the model a few milliseconds apart (each first reads its history);
        without the wait the first would run alone and the rest in a second batch, and their next calls
        would stay out of step. Jobs that queued while a batch ran are past their wait and go at once.
        """
        batch: list[Job] = []
        if room <= 0:
            return batch
        try:
            item = self._jobs.get() if block else self._jobs.get_nowait()
        except queue.Empty:
            return batch
        while item is not _CLOSE:
            batch.append(item)
            if len(batch) >= room:
                break
            wait = batch[0].submitted_at + self.batch_wait - time.monotonic()
            try:
                item = self._jobs.get(timeout=wait) if wait > 0 else self._jobs.get_nowait()
            except queue.Empty:
                break
        return batch

    def _fail_queued(self, error: LLMError) -> None:
        while True:
            try:
                item = self._jobs.get_nowait()
            except queue.Empty:
                return
            if item is not _CLOSE:
                item.settle(error=error)

    def _run_batch(self, loaded: LoadedModel, resumed: list[BatchRow], jobs: list[Job]) -> None:
        """Generate for the resumed rows and every live new job in one batch; an error fails this batch's callers,
        not the thread."""
        rows = resumed + [row for job in jobs if (row := _prepare(loaded, job)) is not None]
        if not rows:
            return
        log.debug("generating a batch of %d (longest prompt %d tokens)",
                  len(rows), max(len(row.prompt_ids) for row in rows))
        try:
            generate_rows(loaded.model, loaded.tokenizer, rows, self.min_new_tokens, self.prefix_cache,
                          should_pause=lambda: self._newcomer_waits(rows),
                          on_finished=lambda row: _settle_row(loaded.tokenizer, row), grammars=loaded.grammars,
                          drafts=self.drafts)
        except torch.OutOfMemoryError:
            _free_device_memory()
            _fail(rows, LLMOutOfMemory(
                f"out of memory generating a batch of {len(rows)}; lower BATCH_SIZE or MAX_NEW_TOKENS"))
            return
        except Exception as error:
            log.exception("generate failed for a batch of %d", len(rows))
            _fail(rows, LLMError(f"the local model failed: {type(error).__name__}: {error}"))
            return
        self._paused = [row for row in rows if not row.finished]

    def _newcomer_waits(self, rows: list[BatchRow]) -> bool:
        """Whether a job waits that this batch has room for (rows that ended free their place): then the batch
        pauses after this step, and the newcomer joins the next one."""
        live = sum(not row.finished for row in rows)
        return not self._jobs.empty() and live < self.batch_size


def _prepare(loaded: LoadedModel, job: Job) -> BatchRow | None:
    """Render and tokenize one job's chat, compile its grammar; a job that is cancelled, cannot be rendered or
    has a grammar that does not compile is settled here."""
    if job.cancelled:
        job.settle(error=LLMCancelled("cancelled before generation started"))
        return None
    try:
        prompt_ids = render_prompt(loaded.tokenizer, job.messages, job.tools)
    except Exception as error:
        job.settle(error=LLMError(f"cannot apply the chat template: {error}"))
        return None
    try:
        grammar = _row_grammar(loaded, job.grammar)
    except LLMError as error:
        log.error("%s", error)
        job.settle(error=error)
        return None
    stream = TextStream(loaded.tokenizer, job.hand_on) if job.on_text is not None else None
    return BatchRow(prompt_ids, job.stop, job.max_new_tokens, lambda: job.cancelled, owner=job, stream=stream,
                    grammar=grammar)


def _row_grammar(loaded: LoadedModel, grammar: Grammar | None) -> RowGrammar | None:
    if grammar is None:
        return None
    if loaded.grammars is None:
        raise LLMError("this model was loaded without a grammar engine")
    return loaded.grammars.row(grammar)


def _settle_row(tokenizer: Any, row: BatchRow) -> None:
    """Answer one caller: its text trimmed at its own stop string, or `LLMCancelled`."""
    job: Job = row.owner
    if row.reason == "cancelled":
        job.settle(error=LLMCancelled("cancelled during generation"))
        return
    raw = tokenizer.decode(row.new_ids, skip_special_tokens=True)
    text, _ = trim_at_stop(raw, row.stop)
    job.settle(Completion(text, len(row.prompt_ids), len(row.new_ids), row.reason, cached_tokens=row.reused_tokens))


def _fail(rows: list[BatchRow], error: LLMError) -> None:
    _fail_jobs([row.owner for row in rows], error)


def _free_device_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _fail_jobs(jobs: list[Job], error: LLMError) -> None:
    for job in jobs:
        job.settle(error=error)
