"""The engines the benchmark compares, each in a process of its own, driven over a pipe by `bench_local.py`.

A process per contender keeps their numbers apart: its start-up is a real start (imports, loading, converting),
its peak memory is its own (the servers' is read from their pid), and an engine left idle costs the others nothing.
The parent sends `("row", RowPlan)` and gets back one result row (a dict) or `("error", text)`.

    local    the real agent on our local backend (`LocalLLM`: the model thread, the prefix cache, step admission)
    raw      the ceiling: the same prompts through `generate_rows` directly, in batches of BATCH_SIZE per round of
             calls, with no agent, tools, database, queue or event loop (only the generation is timed)
    openai   the real agent on our openai backend (`OpenAILLM`) against any chat-completions server
    startup  only `LocalLLM.start()`, timed (in a fresh process: imports and the GGUF conversion are real)
"""

from __future__ import annotations

import asyncio
import functools
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from agent.llm.base import LLM, Completion
from agent.llm.openai import OpenAILLM
from agent.llm.openai_stream import StreamLimits
from agent.tokens import qwen_token_counter
from bench.measures import GpuPeak, LagMeter, PeakMemory, percentile
from bench.react_turns import InstantLLM, Question, ScriptedReact, first_prompt, probe_first_token, question, \
    run_chats
from bot.program.config import Settings
from bot.program.services import Services, start_services
from tools.registry import tools_for_turn

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Spec:
    """One contender: what engine, with which settings."""

    kind: str  # "local", "raw", "openai" or "startup"
    label: str
    model: str
    new_tokens: int = 32
    probe_tokens: int = 256
    probe_gap: float = 1.0
    probes: int = 5
    dtype: str = "auto"
    device_map: str = "cpu"
    batch_size: int = 8
    batch_wait_ms: int = 20
    prefix_cache_mb: int | None = None  # None: PREFIX_CACHE_MB=auto
    converted_dir: str = ""
    openai_url: str = ""
    openai_model: str = "smol"
    ban_token_ids: tuple[int, ...] = ()
    server_pid: int = 0
    listen: bool = False  # the turns have a listener (as in Telegram and the terminal): every call streams
    grammar: bool = False  # every call decoded under the agent's step grammar (local only)
    speculative_tokens: int = 5  # SPECULATIVE_TOKENS (local only; 0: none)
    speculative_step_tokens: int = 8  # SPECULATIVE_STEP_TOKENS


@dataclass(frozen=True)
class RowPlan:
    """One measured row: `chats` chats at once, each asking `turns` questions in order, numbered from `first`;
    then (with `probe`) the first-token probe, on questions numbered after those."""

    chats: int
    turns: int
    first: int
    repeat: int
    probe: bool = True

    def questions(self) -> dict[str, list[Question]]:
        """Session id → its questions, all distinct."""
        return {f"bench:{self.first}:{chat}": [question(self.first + chat * self.turns + turn)
                                               for turn in range(self.turns)] for chat in range(self.chats)}

    def probe_questions(self, count: int) -> tuple[list[Question], list[Question]]:
        """(the other chats generating, the probes): max(1, chats - 1) generating, so that with the probe the
        batch holds `chats` rows (at 1 chat: one generating, one probing)."""
        start = self.first + self.chats * self.turns
        background = max(1, self.chats - 1)
        return ([question(start + n) for n in range(background)],
                [question(start + background + n) for n in range(count)])


class BenchOpenAI(OpenAILLM):
    """Our openai backend with two additions the benchmark needs: a fixed extra request body (the banned end
    tokens: `logit_bias`), and the prompt tokens the server reports it reused (`usage.prompt_tokens_details.
    cached_tokens`, which llama.cpp's `llama-server` and vLLM send) as `Completion.cached_tokens`."""

    def __init__(self, *, extra_body: dict[str, Any], **options: Any):
        super().__init__(**options)
        self.reports_cached = False  # whether the server ever said how much of a prompt it reused
        completions = self._client.chat.completions
        completions.create = functools.partial(completions.create, extra_body=extra_body)  # type: ignore[method-assign]

    def _completion(self, reply: Any, sent: list[Any], stop: Any) -> Completion:
        completion = super()._completion(reply, sent, stop)
        cached = getattr(getattr(reply.usage, "prompt_tokens_details", None), "cached_tokens", None)
        if cached is None:
            return completion
        self.reports_cached = True
        return completion if completion.cached_tokens else replace(completion, cached_tokens=cached)


def ban_body(token_ids: tuple[int, ...]) -> dict[str, Any]:
    """The request body that makes a llama.cpp server generate exactly `max_tokens`: its end tokens banned (it
    has no `ignore_eos` in llama-cpp-python; -100 is the lowest bias the OpenAI API defines)."""
    return {"logit_bias": {str(token): -100 for token in token_ids}} if token_ids else {}


def settings_for(spec: Spec, folder: Path) -> Settings:
    """The bot's settings for a bench run: a fresh database, no time-out that a slow engine could hit."""
    return Settings.of(llm_backend="openai" if spec.kind == "openai" else "local", model=spec.model,
                       model_device_map=spec.device_map, model_dtype=spec.dtype,
                       database_path=folder / "bench.sqlite3", batch_size=spec.batch_size,
                       batch_wait_ms=spec.batch_wait_ms, max_new_tokens=spec.new_tokens, turn_timeout_seconds=3600,
                       prefix_cache_mb="auto" if spec.prefix_cache_mb is None else str(spec.prefix_cache_mb),
                       tokenizer_vocab_path=ROOT / "data" / "qwen.tiktoken",
                       openai_base_url=spec.openai_url, openai_model=spec.openai_model,
                       constrained_decoding=spec.grammar, speculative_tokens=spec.speculative_tokens,
                       speculative_step_tokens=spec.speculative_step_tokens)


def backend_for(spec: Spec, settings: Settings) -> LLM:
    """The backend under test, built as `bot.program.services.build_llm` builds it, with the bench's fixed lengths."""
    if spec.kind == "openai":
        patient = StreamLimits(connect_seconds=60, first_token_seconds=3600, silence_seconds=3600)
        # Retries as the bot's own (OPENAI_MAX_RETRIES): llama-server closes a connection idle for 5 s, the
        # client's pool keeps one for 5 s, and a request sent on one as it closes fails before any answer
        # ("Server disconnected without sending a response"); with no retry that ended whole runs.
        return BenchOpenAI(base_url=spec.openai_url, model=spec.openai_model, limits=patient,
                           max_retries=settings.openai.openai_max_retries,
                           count_tokens=qwen_token_counter(settings.model.tokenizer_vocab_path),
                           extra_body=ban_body(spec.ban_token_ids))
    from agent.llm.engine.speculative import SpeculativeLimits
    from agent.llm.local import LocalLLM

    return LocalLLM(spec.model, device_map=spec.device_map, dtype=spec.dtype, batch_size=spec.batch_size,
                    batch_wait_ms=spec.batch_wait_ms, min_new_tokens=max(spec.new_tokens, spec.probe_tokens),
                    converted_dir=Path(spec.converted_dir) if spec.converted_dir else None,
                    prefix_cache_mb=spec.prefix_cache_mb, kernel_cache_entries=settings.engine.kernel_cache_entries,
                    int8_kept=settings.model.model_int8_kept,
                    speculative=SpeculativeLimits(settings.engine.speculative_tokens, settings.engine.speculative_step_tokens))


class AgentContender:
    """The real agent on a backend (local or openai): turns, prompt tokens, first-token probes, memory."""

    def __init__(self, spec: Spec, services: Services, llm: ScriptedReact):
        self.spec, self.services, self.llm = spec, services, llm
        self.memory = PeakMemory(spec.server_pid or "self") if spec.kind != "openai" or spec.server_pid else None
        self.gpu = GpuPeak() if spec.kind != "openai" else None

    async def row(self, plan: RowPlan) -> dict[str, Any]:
        """Measure one row."""
        await self.settled()
        if self.memory:
            self.memory.reset()
        if self.gpu:
            self.gpu.reset()
        before = len(self.llm.calls)
        async with LagMeter() as lag:
            turns = await run_chats(self.services.agent, self.llm, plan.questions(), listen=self.spec.listen)
        calls = self.llm.calls[before:]
        row = {"tokens": sum(c.completion_tokens for c in calls), "seconds": turns.seconds,
               "turn_p50_s": percentile(turns.latencies, 0.5), "turn_p95_s": percentile(turns.latencies, 0.95),
               "turns": len(turns.latencies), "calls": len(calls),
               "short_calls": sum(c.completion_tokens != self.spec.new_tokens for c in calls),
               "loop_lag_p99_ms": lag.p99_ms() if self.spec.kind == "local" else None,
               **prompt_counts(calls, self.reuse_known())}
        if plan.probe and self.spec.probe_tokens:
            row.update(await self.probe(plan))
        row["peak_rss_mb"] = self.memory.peak_mb() if self.memory else None
        row["gpu_peak_mb"] = self.gpu.peak_mb() if self.gpu else None
        return row

    async def settled(self, limit_s: float = 120.0) -> None:
        """Wait until the local engine is done with what the last row left (its last batch ends after the replies
        that end the row, then the heap is trimmed), so that each row's peak memory is its own."""
        waited = 0.0
        while (state := self.llm.inner.activity()) is not None and state.working and waited < limit_s:
            await asyncio.sleep(0.01)
            waited += 0.01

    def reuse_known(self) -> bool:
        """Whether the backend says how much of each prompt it reused (llama-cpp-python's server does not)."""
        inner = self.llm.inner
        return not isinstance(inner, BenchOpenAI) or inner.reports_cached

    async def probe(self, plan: RowPlan) -> dict[str, Any]:
        """First-token latency of calls arriving while other chats generate `probe_tokens` tokens each."""
        tools = await tools_for_turn(await self.services.tool_settings.enabled_tools("bench"))
        background, probes = plan.probe_questions(self.spec.probes)
        result = await probe_first_token(self.llm.inner, [first_prompt(q, tools) for q in background],
                                         [first_prompt(q, tools) for q in probes], self.spec.probe_tokens,
                                         self.spec.probe_gap)
        return {"first_token_p50_s": percentile(result.latencies, 0.5),
                "first_token_max_s": max(result.latencies, default=None),
                "first_token_n": len(result.latencies),
                "step_s": result.background_seconds / self.spec.probe_tokens,
                "probe_short_calls": sum(n != 1 for n in result.probe_tokens)
                + (result.background_tokens != len(background) * self.spec.probe_tokens)}

    async def close(self) -> None:
        """Stop the backend and close the database."""
        await self.services.close()


def prompt_counts(calls: list[Any], reuse_known: bool) -> dict[str, Any]:
    """Prompt tokens sent, and of those computed and reused (None where the backend does not say)."""
    sent = sum(c.prompt_tokens for c in calls)
    reused = sum(c.reused_tokens for c in calls) if reuse_known else None
    return {"prompt_tokens_sent": sent, "prompt_tokens_reused": reused,
            "prompt_tokens_computed": None if reused is None else sent - reused}


class RawContender:
    """The ceiling: the prompts a run sends (recorded by the agent on an instant backend), each round of calls
    through `generate_rows` in batches of BATCH_SIZE, starting from a prefix cache of the same budget."""

    def __init__(self, spec: Spec, services: Services, recorder: ScriptedReact, loaded: Any):
        from agent.llm.engine.prefix_store import PrefixStore

        self.spec, self.services, self.recorder, self.loaded = spec, services, recorder, loaded
        from agent.llm.engine.memory import default_prefix_store_bytes

        self.store = PrefixStore(default_prefix_store_bytes(loaded.model) if spec.prefix_cache_mb is None
                                 else spec.prefix_cache_mb << 20)
        self.memory, self.gpu = PeakMemory(), GpuPeak()

    async def row(self, plan: RowPlan) -> dict[str, Any]:
        """Record the row's prompts, then time their generation round by round."""
        self.memory.reset()
        self.gpu.reset()
        before = len(self.recorder.prompts)
        await run_chats(self.services.agent, self.recorder, plan.questions())
        prompts = self.recorder.prompts[before:]
        rounds: dict[tuple[int, bool], list[Any]] = {}
        turn_of = {q.n: turn for questions in plan.questions().values() for turn, q in enumerate(questions)}
        for messages, call in zip(prompts, self.recorder.calls[before:]):
            rounds.setdefault((turn_of[call.question], messages[-1]["role"] == "assistant"), []).append(messages)
        seconds, tokens, sent, reused = await asyncio.to_thread(self._generate, [rounds[k] for k in sorted(rounds)])
        return {"tokens": tokens, "seconds": seconds, "turns": plan.chats * plan.turns, "calls": len(prompts),
                "prompt_tokens_sent": sent, "prompt_tokens_reused": reused, "prompt_tokens_computed": sent - reused,
                "peak_rss_mb": self.memory.peak_mb(), "gpu_peak_mb": self.gpu.peak_mb()}

    def _generate(self, rounds: list[list[Any]]) -> tuple[float, int, int, int]:
        from agent.llm.engine.batch import BatchRow, generate_rows, render_prompt
        from agent.llm.engine.speculative import SpeculativeLimits

        model, tokenizer = self.loaded.model, self.loaded.tokenizer
        seconds = 0.0
        rows: list[BatchRow] = []
        for calls in rounds:
            for start in range(0, len(calls), self.spec.batch_size):
                batch = [BatchRow(render_prompt(tokenizer, messages, None), max_new_tokens=self.spec.new_tokens)
                         for messages in calls[start:start + self.spec.batch_size]]
                began = time.perf_counter()
                limits = SpeculativeLimits(self.spec.speculative_tokens, self.spec.speculative_step_tokens)
                generate_rows(model, tokenizer, batch, self.spec.new_tokens, self.store, speculative=limits)
                seconds += time.perf_counter() - began
                rows.extend(batch)
        return (seconds, sum(len(r.new_ids) for r in rows), sum(len(r.prompt_ids) for r in rows),
                sum(r.reused_tokens for r in rows))

    async def close(self) -> None:
        """Close the database."""
        await self.services.close()


async def open_contender(spec: Spec, folder: Path) -> tuple[Any, dict[str, Any]]:
    """Start the contender; return it and its start-up facts."""
    settings = settings_for(spec, folder)
    if spec.kind == "raw":
        return await _open_raw(spec, settings)
    backend = backend_for(spec, settings)
    llm = ScriptedReact(backend, spec.new_tokens, grammar=spec.grammar)
    services = await start_services(settings, llm=llm)
    facts = {"start_s": llm.start_seconds}
    if spec.kind != "openai":
        facts.update(peak_rss_mb=PeakMemory().peak_mb(), dtype=getattr(backend, "mode", ""))
    return AgentContender(spec, services, llm), facts


async def _open_raw(spec: Spec, settings: Settings) -> tuple[Any, dict[str, Any]]:
    from agent.llm.engine import kernel_cache
    from agent.llm.engine.loading import load_model, resolve_model

    kernel_cache.limit(settings.engine.kernel_cache_entries)
    started = time.perf_counter()
    loaded = await asyncio.to_thread(load_model, resolve_model(spec.model), spec.device_map, spec.dtype,
                                     Path(spec.converted_dir) if spec.converted_dir else None)
    start_s = time.perf_counter() - started
    tokenizer = loaded.tokenizer
    recorder = ScriptedReact(InstantLLM(lambda text: len(tokenizer.encode(text, add_special_tokens=False))),
                             spec.new_tokens)
    services = await start_services(settings, llm=recorder)
    return RawContender(spec, services, recorder, loaded), {"start_s": start_s, "peak_rss_mb": PeakMemory().peak_mb(),
                                                            "dtype": loaded.mode}


def serve(spec: Spec, conn: Any) -> None:
    """The contender process: start, say so, then answer the parent's commands until told to close."""
    try:
        asyncio.run(_serve(spec, conn))
    except BaseException as error:  # anything at all: the parent must hear of it, not wait forever
        text = str(error) if isinstance(error, SystemExit) else traceback.format_exc()
        conn.send(("error", f"{spec.label}: {text}"))
    finally:
        conn.close()


async def _serve(spec: Spec, conn: Any) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-") as folder:
        contender, facts = await open_contender(spec, Path(folder))
        try:
            conn.send(("ready", facts))
            while True:
                command, payload = await asyncio.to_thread(conn.recv)
                if command == "close":
                    return
                conn.send(("row", await contender.row(payload)))
        finally:
            await contender.close()


def describe(spec: Spec) -> dict[str, Any]:
    """The spec as plain data, for the JSON rows."""
    return {key: value for key, value in asdict(spec).items() if value not in ("", 0, ())}
