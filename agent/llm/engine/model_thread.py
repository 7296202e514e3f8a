"""The model thread: the one thread that owns the model and its tokenizer, and batches requests across chats.

    event loop                               model thread
    ──────────                               ────────────
    submit(Job) ──── JobQueue (jobs.py) ───▶ admit queued jobs (admission.py), up to batch_size rows
                                             one decode loop for all of them (batch.py), each row
                                             masked by its own grammar (if its caller gave one) and
                                             ending on its own stop strings / token limit / cancel token
    job.on_text ◀─────── call_soon_threadsafe ─ each row's new text as it is generated (if its caller listens)
    await job.future ◀── call_soon_threadsafe ─ settle each job with its Completion or its error

Nothing but this thread touches torch, the model or this tokenizer: HF fast tokenizers raise "Already borrowed"
when one instance is used from two threads, and a blocked event loop would freeze every chat.

A request that arrives during a batch joins at the next step when the admission policy lets it: the batch pauses,
its unfinished rows keep their own KV and go on in the next batch beside the newcomer (batch.py). Admission
(admission.py) takes people's jobs round-robin across users, and background jobs only while no person's job waits or
runs (a background row is held aside, with its KV, when one comes).
Every caller is answered as soon as its own row ends, not when the batch does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from agent.errors import LLMCancelled, LLMError, LLMOutOfMemory
from agent.grammar import Grammar
from agent.llm.base import Completion, ModelActivity, ModelCounters, trim_at_stop
from agent.llm.engine.admission import Admission
from agent.llm.engine.batch import BatchRow, generate_rows, render_prompt
from agent.llm.engine.grammar_masks import GrammarEngine, RowGrammar
from agent.llm.engine.jobs import Job, JobQueue, resolve
from agent.llm.engine.load_leftovers import trim_heap
from agent.llm.engine.memory import PREFIX_CACHE_TOKENS, default_prefix_store_bytes
from agent.llm.engine.prefix_store import PrefixStore
from agent.llm.engine.speculative import SpeculativeLimits
from agent.llm.engine.text_stream import TextStream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """What the loader hands the model thread: the model, and the tokenizer and grammar engine only it may use."""

    model: Any
    tokenizer: Any
    grammars: GrammarEngine | None = None  # None: grammars are refused (a test double)
    mode: str = ""  # what MODEL_DTYPE runs as: a dtype's name, or int8/int4 (for logs and the bench)


class ModelThread:
    """Owns the model thread: loads the model there, then runs batches of jobs until closed."""

    def __init__(self, load: Callable[[], LoadedModel], *, admission: Admission,
                 min_new_tokens: int = 0, prefix_store_bytes: int | None = 0,
                 speculative: SpeculativeLimits = SpeculativeLimits(), counters: ModelCounters | None = None):
        self._load = load
        self.admission = admission  # which queued jobs join the next batch, and when a batch pauses for them
        self.speculative = speculative  # speculative tokens a step may check per row and per batch
        # Benchmarks only: force every row to generate at least this many tokens, so runs are comparable.
        self.min_new_tokens = min_new_tokens
        self._jobs = JobQueue()
        self._thread = threading.Thread(target=self._main, name="model", daemon=True)
        self._loaded: asyncio.Future | None = None
        self._exited: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._current: list[Job] = []
        # Rows paused so that a newcomer could join: each holds its own KV, and resumes in a later batch (the next
        # one, unless admission holds a background row aside while people's jobs need its place).
        self._paused: list[BatchRow] = []
        # None: sized once the model is loaded, from its KV bytes per token (memory.py)
        self._prefix_store_bytes = prefix_store_bytes
        self.prefix_store = PrefixStore(prefix_store_bytes or 0)
        self._trimming = False
        self._closing = threading.Event()
        # Plain counts for whoever reports them (batches, rows, speculative tokens; the queue read when asked),
        # and when the thread last made progress, for a health check to tell a stuck thread from an idle one.
        self.counters = counters if counters is not None else ModelCounters()
        self.counters.queued_jobs = self._jobs.size
        self._progress_at = time.monotonic()

    async def start(self) -> LoadedModel:
        """Start the thread, load the model on it, and wait (without blocking the loop) until it is ready."""
        self._loop = asyncio.get_running_loop()
        self._loaded, self._exited = self._loop.create_future(), self._loop.create_future()
        self._thread.start()
        return await self._loaded

    def activity(self) -> ModelActivity:
        """Whether the thread is alive, has work (queued or running), and how long since its last step; an idle
        thread's clock starts again when work arrives. Safe to call from any thread."""
        working = bool(self._current) or not self._jobs.empty() or self._trimming
        return ModelActivity(alive=self._thread.is_alive(), working=working,
                             seconds_since_progress=time.monotonic() - self._progress_at,
                             detail="" if self._thread.is_alive() or self._exited is None else "it has exited")

    def submit(self, job: Job) -> None:
        """Queue a job for the next batch; called on the event loop."""
        if self._exited is None or self._closing.is_set():
            raise LLMError("the local model is not running (start() was not called, or it has closed)")
        if not self._current and self._jobs.empty():
            self._progress_at = time.monotonic()  # work arrives at an idle thread: its clock starts now
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
        self._jobs.wake()  # the thread stops waiting for work, if it is
        await asyncio.shield(self._exited)

    # ── everything below runs on the model thread ────────────────────────────────────────────────────────────

    def _main(self) -> None:
        try:
            loaded = self._load()
        except BaseException as error:  # the loader maps what it can; anything else still reaches start()
            self._signal(self._loaded, None, error)
            self._signal(self._exited, None, None)
            return
        if self._prefix_store_bytes is None:
            self.prefix_store.budget_bytes = default_prefix_store_bytes(loaded.model)
            log.info("prefix store: up to %d MiB (the KV of %d tokens of this model)",
                     self.prefix_store.budget_bytes >> 20, PREFIX_CACHE_TOKENS)
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
        _fail_jobs(self._current + [row.owner for row in self._paused], stopped)
        self._jobs.fail_all(stopped)
        self._signal(self._exited, None, None)

    def _signal(self, future: asyncio.Future | None, result: Any, error: BaseException | None) -> None:
        if future is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(resolve, future, result, error)

    def _serve(self, loaded: LoadedModel) -> None:
        while True:
            going_on = self.admission.resume(self._jobs, [row.owner for row in self._paused])
            resumed = [row for row in self._paused if any(row.owner is job for job in going_on)]
            held = [row for row in self._paused if not any(row is other for other in resumed)]  # making room
            admitted = self.admission.admit(self._jobs, [row.owner for row in resumed])
            self._current = [row.owner for row in resumed + held] + admitted
            if self._closing.is_set():
                closed = LLMError("the local model is shutting down")
                _fail_jobs(self._current, closed)
                self._jobs.fail_all(closed)
                return
            self._paused = held + self._run_batch(loaded, resumed, admitted)
            self._current = [row.owner for row in self._paused]
            if not self._paused and self._jobs.empty():
                # Idle: a batch's activations were freed into glibc's heap, which keeps them (load_leftovers.py);
                # handed back, the process holds what the model and the caches need, not its busiest moment's.
                self._trimming = True  # still working until it is done: what the benchmark waits for
                trim_heap()
                self._trimming = False

    def _run_batch(self, loaded: LoadedModel, resumed: list[BatchRow], jobs: list[Job]) -> list[BatchRow]:
        """Generate for the resumed rows and every live new job in one batch; return the rows it paused. An error
        fails this batch's callers, not the thread."""
        self._progress_at = time.monotonic()
        rows = resumed + [row for job in jobs if (row := _prepare(loaded, job)) is not None]
        if not rows:
            return []
        log.debug("generating a batch of %d (longest prompt %d tokens)",
                  len(rows), max(len(row.prompt_ids) for row in rows))
        self._count_batch(len(rows))
        try:
            generate_rows(loaded.model, loaded.tokenizer, rows, self.min_new_tokens, self.prefix_store,
                          should_pause=lambda: self.admission.should_pause(self._jobs, _live(rows)),
                          on_finished=lambda row: _settle_row(loaded.tokenizer, row), grammars=loaded.grammars,
                          speculative=self.speculative, on_pass=self._count_pass)
        except torch.OutOfMemoryError:
            _free_device_memory()
            _fail(rows, LLMOutOfMemory(
                f"out of memory generating a batch of {len(rows)}; lower BATCH_SIZE or MAX_NEW_TOKENS"))
            return []
        except Exception as error:
            log.exception("generate failed for a batch of %d", len(rows))
            _fail(rows, LLMError(f"the local model failed: {type(error).__name__}: {error}"))
            return []
        finally:
            self.counters.batch_rows = 0
            self._progress_at = time.monotonic()
        return [row for row in rows if not row.finished]

    def _count_batch(self, rows: int) -> None:
        self.counters.batches += 1
        self.counters.batch_rows_total += rows
        self.counters.batch_rows = rows

    def _count_pass(self, offered: int, taken: int) -> None:
        """One pass through the model: progress, and the speculative tokens it checked and took."""
        self._progress_at = time.monotonic()
        self.counters.speculative_proposed += offered
        self.counters.speculative_accepted += taken


def _live(rows: list[BatchRow]) -> list[Job]:
    """The jobs of the rows still generating."""
    return [row.owner for row in rows if not row.finished]


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
