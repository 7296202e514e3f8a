"""The model thread: the one thread that owns the model and its tokenizer, and batches requests across chats.

    event loop                               model thread
    ──────────                               ────────────
    submit(Job) ──── queue.Queue ──────────▶ take every pending job (up to batch_size)
                                             one left-padded `model.generate` for all of them,
                                             each row ending on its own stop strings / limit / cancel token
    await job.future ◀── call_soon_threadsafe ─ settle each job with its Completion or its error

Nothing but this thread touches torch, the model or this tokenizer: HF fast tokenizers raise "Already borrowed"
when one instance is used from two threads, and a blocked event loop would freeze every chat.

Why plain padded `generate` and not transformers' continuous batching (`generate_batch` / its manager): measured
on the 2-core CPU box with SmolLM2-135M, 8 prompts × 32 new tokens, greedy fp32: padded `generate` ran at 83
tokens/s, the continuous-batching manager at under 36 (paged attention has no fast CPU path), and the manager
has no per-request stop strings or cancellation. A request that arrives mid-batch waits for the next batch:
with ReAct calls of similar length that costs little, and every row still ends as soon as its own output does.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

from agent.errors import LLMCancelled, LLMError, LLMOutOfMemory
from agent.llm.base import CancelToken, Completion, Message, trim_at_stop

log = logging.getLogger(__name__)

_CLOSE = object()  # queue sentinel: the thread finishes its batch and exits


@dataclass(frozen=True)
class LoadedModel:
    """What the loader hands the model thread: the model and the tokenizer only that thread may use."""

    model: Any
    tokenizer: Any


@dataclass
class Job:
    """One `complete` call in flight: the request, where its answer goes, and how to cancel it."""

    messages: Sequence[Message]
    stop: tuple[str, ...]
    max_new_tokens: int
    tools: list[dict[str, Any]] | None
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    caller_cancel: CancelToken | None = None
    own_cancel: CancelToken = field(default_factory=CancelToken)

    @property
    def cancelled(self) -> bool:
        """Whether the caller's token or our own (the awaiting task was cancelled, or the worker is closing) is set."""
        return self.own_cancel.cancelled or (self.caller_cancel is not None and self.caller_cancel.cancelled)

    def settle(self, result: Completion | None = None, error: BaseException | None = None) -> None:
        """Resolve the future from the model thread, on the event loop's own thread."""
        try:
            self.loop.call_soon_threadsafe(_resolve, self.future, result, error)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _resolve(future: asyncio.Future, result: Completion | None, error: BaseException | None) -> None:
    if future.done():  # the awaiting task was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


@dataclass
class _Row:
    """A job turned into prompt tokens, plus how and when its row ended."""

    job: Job
    prompt_ids: list[int]
    ended_after: int = 0  # how many generated tokens belong to this row's output
    reason: str = ""  # "stop", "length" or "cancelled"; empty while it is still generating
    new_ids: list[int] = field(default_factory=list)


class RowStops(StoppingCriteria):
    """Per-row end conditions for one batch: each row's own stop strings, token limit and cancel token.

    Returning a per-row bool tensor lets `generate` mark just that row finished (its `unfinished_sequences`),
    so one chat's stop string or /cancel never cuts another chat's answer short.
    """

    def __init__(self, rows: list[_Row], prompt_width: int, tokenizer: Any, eos_ids: set[int]):
        self.rows = rows
        self.prompt_width = prompt_width
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_width
        for index, row in enumerate(self.rows):
            if row.reason == "":
                self._check(row, input_ids[index, self.prompt_width:], generated)
        return torch.tensor([row.reason != "" for row in self.rows], device=input_ids.device)

    def _check(self, row: _Row, new_ids: torch.Tensor, generated: int) -> None:
        if row.job.cancelled:
            row.ended_after, row.reason = generated, "cancelled"
        elif int(new_ids[-1]) in self.eos_ids:
            row.ended_after, row.reason = generated - 1, "stop"  # the end-of-turn token is not text
        elif row.job.stop and _has_stop(self.tokenizer.decode(new_ids), row.job.stop):
            row.ended_after, row.reason = generated, "stop"
        elif generated >= row.job.max_new_tokens:
            row.ended_after, row.reason = generated, "length"


def _has_stop(text: str, stop: Sequence[str]) -> bool:
    return any(s and s in text for s in stop)


class ModelWorker:
    """Owns the model thread: loads the model there, then runs batches of jobs until closed."""

    def __init__(self, load: Callable[[], LoadedModel], *, batch_size: int, min_new_tokens: int = 0):
        self._load = load
        self.batch_size = batch_size
        # Benchmarks only: force every row to generate at least this many tokens, so runs are comparable.
        self.min_new_tokens = min_new_tokens
        self._jobs: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._main, name="model", daemon=True)
        self._loaded: asyncio.Future | None = None
        self._exited: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._current: list[Job] = []
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
            self._current = self._next_batch()
            if self._closing.is_set():
                closed = LLMError("the local model is shutting down")
                _fail_jobs(self._current, closed)
                self._fail_queued(closed)
                return
            self._run_batch(loaded, self._current)
            self._current = []

    def _next_batch(self) -> list[Job]:
        """Block for one job, then take whatever else is already waiting, up to the batch size."""
        batch: list[Job] = []
        item = self._jobs.get()
        while item is not _CLOSE:
            batch.append(item)
            if len(batch) >= self.batch_size:
                break
            try:
                item = self._jobs.get_nowait()
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

    def _run_batch(self, loaded: LoadedModel, jobs: list[Job]) -> None:
        """Generate for every live job in one batch; an error fails this batch's callers, not the thread."""
        rows = [row for job in jobs if (row := _prepare(loaded.tokenizer, job)) is not None]
        if not rows:
            return
        log.debug("generating a batch of %d (longest prompt %d tokens)", len(rows), max(len(r.prompt_ids) for r in rows))
        try:
            _generate(loaded, rows, self.min_new_tokens)
        except torch.OutOfMemoryError:
            _free_device_memory()
            _fail(rows, LLMOutOfMemory(
                f"out of memory generating a batch of {len(rows)}; lower BATCH_SIZE or MAX_NEW_TOKENS"))
            return
        except Exception as error:
            log.exception("generate failed for a batch of %d", len(rows))
            _fail(rows, LLMError(f"the local model failed: {type(error).__name__}: {error}"))
            return
        for row in rows:
            _settle_row(loaded.tokenizer, row)


def _prepare(tokenizer: Any, job: Job) -> _Row | None:
    """Render and tokenize one job's chat; a job that is cancelled or cannot be rendered is settled here."""
    if job.cancelled:
        job.settle(error=LLMCancelled("cancelled before generation started"))
        return None
    try:
        return _Row(job, render_prompt(tokenizer, job.messages, job.tools))
    except Exception as error:
        job.settle(error=LLMError(f"cannot apply the chat template: {error}"))
        return None


def render_prompt(tokenizer: Any, messages: Sequence[Message], tools: list[dict[str, Any]] | None) -> list[int]:
    """Token ids of the chat: continuing a final assistant message, else opening a new assistant turn."""
    continuing = bool(messages) and messages[-1].get("role") == "assistant"
    encoded = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        tools=tools,
        add_generation_prompt=not continuing,
        continue_final_message=continuing,
        # Control tokens typed by users (`<|im_start|>system ...`) are encoded as plain text, not obeyed.
        sanitize_control_tokens=True,
        return_dict=True,
    )
    return list(encoded["input_ids"])


def _generate(loaded: LoadedModel, rows: list[_Row], min_new_tokens: int) -> None:
    """One greedy `generate` over the left-padded rows; each row's end is recorded by `RowStops`."""
    model, tokenizer = loaded.model, loaded.tokenizer
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos_ids)
    input_ids, attention_mask = _left_pad([row.prompt_ids for row in rows], pad_id, model.device)
    longest = max(row.job.max_new_tokens for row in rows)
    config = GenerationConfig(
        # Greedy: a turn is reproducible, and a row's output does not depend on its batch neighbours.
        do_sample=False,
        max_new_tokens=longest,
        min_new_tokens=min(min_new_tokens, longest),
        eos_token_id=sorted(eos_ids),
        pad_token_id=pad_id,
    )
    stops = RowStops(rows, input_ids.shape[1], tokenizer, eos_ids)
    with torch.inference_mode():
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                                stopping_criteria=StoppingCriteriaList([stops]))
    _keep_generated(rows, output[:, input_ids.shape[1]:].tolist())


def _keep_generated(rows: list[_Row], generated: list[list[int]]) -> None:
    """Cut each row's tokens where that row ended; what the batch generated after that is padding."""
    for row, ids in zip(rows, generated):
        if row.reason == "":  # defensive: generate stopped before `RowStops` saw the row's last step
            row.ended_after, row.reason = len(ids), "length"
        row.new_ids = ids[: row.ended_after]


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    configured = model.generation_config.eos_token_id
    ids = set(configured if isinstance(configured, list) else [configured] if configured is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def _left_pad(sequences: list[list[int]], pad_id: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad on the left, so every row's next token is predicted at the same position of the batch."""
    width = max(len(s) for s in sequences)
    ids = torch.tensor([[pad_id] * (width - len(s)) + s for s in sequences], device=device)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences], device=device)
    return ids, mask


def _settle_row(tokenizer: Any, row: _Row) -> None:
    """Answer one caller: its text trimmed at its own stop string, or `LLMCancelled`."""
    if row.reason == "cancelled":
        row.job.settle(error=LLMCancelled("cancelled during generation"))
        return
    raw = tokenizer.decode(row.new_ids, skip_special_tokens=True)
    text, _ = trim_at_stop(raw, row.job.stop)
    row.job.settle(Completion(text, len(row.prompt_ids), len(row.new_ids), row.reason))


def _fail(rows: list[_Row], error: LLMError) -> None:
    _fail_jobs([row.job for row in rows], error)


def _free_device_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _fail_jobs(jobs: list[Job], error: LLMError) -> None:
    for job in jobs:
        job.settle(error=error)
