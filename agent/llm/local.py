"""The local backend (`LLM_BACKEND=local`): a transformers model on this machine, served by the engine
(agent/llm/engine/, drawn in its README.md).

This is the engine's face towards the agent: `complete` queues a job for the model thread and awaits its row.
Loading happens on the model thread (engine/loading.py); the event loop only awaits it. Token counting uses a
second tokenizer instance that stays on the event loop.
"""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

from agent.errors import LLMError
from agent.llm.base import LLM, Completion, ModelActivity, ModelRequest
from agent.llm.engine import kernel_cache
from agent.llm.engine.admission import BatchLimits, FairAdmission
from agent.llm.engine.jobs import Job
from agent.llm.engine.loading import check_dtype_setting, load_model, resolve_model
from agent.llm.engine.model_thread import ModelThread
from agent.llm.engine.saved_int8 import KEPT as INT8_KEPT
from agent.llm.engine.speculative import SpeculativeLimits


class LocalLLM(LLM):
    """A transformers model on this machine; `complete` calls from all chats are batched on the model thread."""

    name = "local"

    def __init__(self, model: str, *, device_map: str = "auto", dtype: str = "auto",
                 batch_size: int = BatchLimits.batch_size, batch_wait_ms: int = BatchLimits.batch_wait_ms, min_new_tokens: int = 0, converted_dir: Path | None = None,
                 prefix_cache_mb: int | None = 0, base_dir: Path | None = None, cache_dir: Path | None = None,
                 native_tools: bool = False, speculative: SpeculativeLimits = SpeculativeLimits(),
                 low_priority_rows: int = BatchLimits.low_priority_rows,
                 kernel_cache_entries: int = kernel_cache.KERNEL_CACHE_ENTRIES, int8_kept: int = INT8_KEPT):
        self.model_setting = model
        self.speculative = speculative
        self.converted_dir = converted_dir
        self.prefix_cache_mb = prefix_cache_mb  # None: sized from the model once loaded (engine/memory.py)
        self.base_dir = base_dir  # where a relative MODEL path is looked for (the data directory)
        self.cache_dir = cache_dir  # where hub models are downloaded to and looked for
        self.native_tools = native_tools  # AGENT_MODE=native: the chat template must render tools
        self.device_map = device_map
        self.dtype = dtype
        self.mode = ""  # what `dtype` runs as once started (auto resolved: a dtype's name, or int8/int4)
        self.batch_size = batch_size
        self.batch_wait_ms = batch_wait_ms
        self.low_priority_rows = low_priority_rows  # background rows (summaries) a batch may hold at once
        self.min_new_tokens = min_new_tokens  # benchmarks only: fixed-length generations
        self.kernel_cache_entries = kernel_cache_entries
        self.int8_kept = int8_kept  # models whose int8 weights stay saved in converted_dir (engine/saved_int8.py)
        self._thread: ModelThread | None = None
        self._counter: Any = None  # the event loop's own tokenizer, for count_tokens

    async def start(self) -> None:
        """Load the model on its thread and wait for it; raises `ModelLoadError` with one clear line."""
        source = resolve_model(self.model_setting, self.base_dir)
        check_dtype_setting(self.dtype)
        kernel_cache.limit(self.kernel_cache_entries)  # before loading: oneDNN reads it at its first kernel
        thread = ModelThread(lambda: load_model(source, self.device_map, self.dtype, self.converted_dir,
                                                self.cache_dir, self.native_tools, self.int8_kept),
                             admission=FairAdmission(self.batch_size, self.batch_wait_ms / 1000,
                                                     self.low_priority_rows),
                             min_new_tokens=self.min_new_tokens,
                             prefix_store_bytes=None if self.prefix_cache_mb is None else self.prefix_cache_mb << 20,
                             speculative=self.speculative, counters=self.counters)
        loaded = await thread.start()
        # A copy is a separate Rust object, so the loop and the model thread never share a tokenizer. Copying
        # here is safe: no job can reach the model thread before `self._thread` is set below.
        self._counter = copy.deepcopy(loaded.tokenizer)
        self.mode = loaded.mode
        self._thread = thread

    async def close(self) -> None:
        """Cancel what is in flight and stop the model thread."""
        if self._thread is not None:
            await self._thread.close()

    async def complete(self, request: ModelRequest) -> Completion:
        """Queue the request for the next batch and await its row (decoded under its grammar, if any; its text
        streamed to its `on_text` as the model thread generates it); cancelling the awaiting task cancels the row.
        Admission shares the rows round-robin across the requests' `user_key`s; a LOW request runs only while no
        other request waits or runs (engine/admission.py)."""
        if self._thread is None:
            raise LLMError("the local model is not started")
        loop = asyncio.get_running_loop()
        job = Job(list(request.messages), tuple(request.stop), request.max_new_tokens,
                  list(request.tools) if request.tools else None, loop, loop.create_future(), grammar=request.grammar,
                  caller_cancel=request.cancel, on_text=request.on_text, user_key=request.user_key,
                  priority=request.priority)
        self._thread.submit(job)
        try:
            return self.counters.count(await job.future)
        except asyncio.CancelledError:
            job.own_cancel.cancel()  # the row stops at its next step; the other rows go on
            raise

    def activity(self) -> ModelActivity | None:
        """The model thread's state (alive, working, last step), once started."""
        return self._thread.activity() if self._thread is not None else None

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` for this model, counted with the event loop's own tokenizer."""
        if self._counter is None:
            raise LLMError("the local model is not started")
        return len(self._counter.encode(text, add_special_tokens=False))
