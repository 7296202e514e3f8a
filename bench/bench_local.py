"""Benchmark: full ReAct turns from concurrent chats on the local backend, three ways, in one process.

    serial   one model call at a time (a lock around the backend), as the original article's `model.chat` does
    batched  the model thread batching every pending call into one `generate` (agent/llm/worker.py)
    raw      the ceiling: the prompts the batched run sent, in `model.generate` calls of up to BATCH_SIZE rows,
             with no agent, tools, database, queue or event loop around them; twice: laid out as the worker lays
             them out (shared prompt prefix computed once: the ceiling proper), and plainly left-padded (every row
             computes its whole prompt: what batching without prefix sharing would reach)

    batched, grammar   (--grammar) the batched run again, every model call decoded under the agent's step grammar
             (agent/grammar.py, llguidance masks per row): what constrained decoding costs

Every model call generates exactly --new-tokens tokens (EOS suppressed, no stop strings), so runs are comparable.
Under the grammar a row must not finish early either, so the bench lets the step repeat (`start: step+`): every
token stays masked, none is generated unconstrained.
The offline model (SmolLM2-135M) cannot follow ReAct, so `FixedReplyLLM` runs the real generation through the
backend (real prompts, real cost, real token counts) and then hands the agent a fixed Qwen-shaped reply: first an
Action calling course_query for 大模型技术实战, then a Final Answer. Every turn therefore takes the same path through
the real agent, prompt rendering, tool registry, course tool and SQLite database.

    .venv/bin/python bench/bench_local.py                       # 1, 4, 8, 16 chats; 32 tokens per call
    .venv/bin/python bench/bench_local.py --chats 8 --new-tokens 64
    .venv/bin/python bench/bench_local.py --chats 1 8 --grammar --only-batched   # the cost of the grammar alone
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.grammar import Grammar  # noqa: E402
from agent.llm.base import LLM, CancelToken, Completion, Message  # noqa: E402
from agent.llm.local import LocalLLM, ModelSource, load_model, resolve_model  # noqa: E402
from agent.llm.batching import cache_argument, lay_out, prefill_shared_prefix, render_prompt  # noqa: E402
from agent.loop import Agent, Session  # noqa: E402
from bot.config import Settings  # noqa: E402
from bot.services import Services, start_services  # noqa: E402

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = "请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？"
ACTION_REPLY = ("Thought: 我需要查询大模型技术实战课程的课时数。\n"
                "Action: course_query\n"
                'Action Input: {"course_name": "大模型技术实战"}\n')
FINAL_REPLY = " I now know the final answer\nFinal Answer: 大模型技术实战课程目前一共上线了200节。"


class FixedReplyLLM(LLM):
    """Real generation through `inner`, then a fixed ReAct reply: an action first, the final answer after it."""

    name = "fixed-reply"

    def __init__(self, inner: LocalLLM, new_tokens: int, *, one_at_a_time: bool):
        self.inner = inner
        self.new_tokens = new_tokens
        self.constrained = False  # generate under the agent's step grammar (made repeatable: see `endless`)
        self._gate: Any = asyncio.Lock() if one_at_a_time else contextlib.nullcontext()
        self.generated = 0
        self.calls: list[list[Message]] = []  # every prompt, for the raw ceiling

    async def start(self) -> None:
        """Start the wrapped backend."""
        await self.inner.start()

    async def close(self) -> None:
        """Close the wrapped backend."""
        await self.inner.close()

    def count_tokens(self, text: str) -> int:
        """The wrapped backend's count."""
        return self.inner.count_tokens(text)

    async def complete(self, messages: Sequence[Message], *, stop: Sequence[str] = (), max_new_tokens: int = 512,
                       tools: Sequence[dict[str, Any]] | None = None, cancel: CancelToken | None = None,
                       grammar: Grammar | None = None) -> Completion:
        """Generate `new_tokens` real tokens for `messages`, then answer with the scripted ReAct text."""
        grammar = endless(grammar) if self.constrained and grammar is not None else None
        async with self._gate:
            real = await self.inner.complete(messages, max_new_tokens=self.new_tokens, tools=tools, cancel=cancel,
                                             grammar=grammar)
        self.generated += real.completion_tokens
        self.calls.append(list(messages))
        continuing = messages[-1]["role"] == "assistant"  # the trace already holds the Observation
        return Completion(FINAL_REPLY if continuing else ACTION_REPLY, real.prompt_tokens, real.completion_tokens)


def endless(grammar: Grammar) -> Grammar:
    """The step grammar, repeatable: a fixed-length run may not end where one step does (its EOS is banned)."""
    return Grammar(grammar.kind, grammar.lark.replace("start: ", "start: step+\nstep: ", 1))


class LagMeter:
    """A ticker coroutine every 10 ms; records how late each tick wakes up (the event loop's lag)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "LagMeter":
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            self.lags.append(time.perf_counter() - before - 0.01)

    def p99_ms(self) -> float:
        """The 99th percentile lag in milliseconds."""
        return percentile(self.lags, 0.99) * 1000


@dataclass
class Row:
    """One line of the results table."""

    chats: int
    mode: str
    tokens: int
    seconds: float
    latencies: list[float] = field(default_factory=list)
    lag_p99_ms: float | None = None

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per wall-clock second."""
        return self.tokens / self.seconds

    def markdown(self) -> str:
        """The row in the README's table format."""
        latency = (f"{percentile(self.latencies, 0.5):.2f} | {percentile(self.latencies, 0.95):.2f}"
                   if self.latencies else "– | –")
        lag = f"{self.lag_p99_ms:.1f}" if self.lag_p99_ms is not None else "–"
        return f"| {self.chats} | {self.mode} | {self.tokens} | {self.seconds:.2f} | {self.tokens_per_second:.1f} | {latency} | {lag} |"


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of `values` (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


async def one_turn(agent: Agent, session: Session) -> float:
    """Run one turn and check it took the scripted path (tool, then answer); return its latency in seconds."""
    started = time.perf_counter()
    result = await agent.run(session, QUESTION)
    kinds = [step.kind for step in result.steps]
    if kinds != ["tool", "final"] or "200" not in result.steps[0].observation or "200" not in result.answer:
        raise SystemExit(f"turn took an unexpected path: {kinds} {result.steps} {result.answer!r}")
    return time.perf_counter() - started


async def agent_phase(agent: Agent, llm: FixedReplyLLM, chats: int, mode: str) -> Row:
    """`chats` concurrent sessions, each running one full turn; tokens, latencies and loop lag measured."""
    sessions = [Session(id=f"bench:{mode}:{chats}:{i}", chat_key="bench") for i in range(chats)]
    before = llm.generated
    async with LagMeter() as lag:
        started = time.perf_counter()
        latencies = await asyncio.gather(*(one_turn(agent, session) for session in sessions))
        seconds = time.perf_counter() - started
    return Row(chats, mode, llm.generated - before, seconds, list(latencies), lag.p99_ms())


class RawCeiling:
    """A second copy of the model, loaded by the same code, driven by plain `generate` on a thread of its own."""

    def __init__(self, source: ModelSource, dtype: str, batch_size: int, new_tokens: int):
        self.source, self.dtype = source, dtype
        self.batch_size, self.new_tokens = batch_size, new_tokens
        self.loaded: Any = None

    async def load(self) -> None:
        """Load the copy off the event loop."""
        self.loaded = await asyncio.to_thread(load_model, self.source, "cpu", self.dtype)

    async def run(self, prompts: list[list[Message]], chats: int, share_prefix: bool) -> Row:
        """Generate for every recorded prompt, in the batches the worker would form; time `generate` only."""
        seconds, tokens = await asyncio.to_thread(self._generate_all, prompts, share_prefix)
        mode = "raw, shared prefix" if share_prefix else "raw, padded"
        return Row(chats, mode, tokens, seconds)

    def _generate_all(self, prompts: list[list[Message]], share_prefix: bool) -> tuple[float, int]:
        first_calls = [p for p in prompts if p[-1]["role"] != "assistant"]
        second_calls = [p for p in prompts if p[-1]["role"] == "assistant"]
        seconds, tokens = 0.0, 0
        for calls in (first_calls, second_calls):
            for start in range(0, len(calls), self.batch_size):
                spent, made = self._generate(calls[start:start + self.batch_size], share_prefix)
                seconds, tokens = seconds + spent, tokens + made
        return seconds, tokens

    def _generate(self, batch: list[list[Message]], share_prefix: bool) -> tuple[float, int]:
        """One `generate` on the batch laid out as the worker lays it out (or plainly left-padded)."""
        import torch

        model, tokenizer = self.loaded.model, self.loaded.tokenizer
        layout = lay_out([render_prompt(tokenizer, messages, None) for messages in batch],
                         tokenizer.pad_token_id, model.device, share_prefix)
        started = time.perf_counter()
        with torch.inference_mode():
            cache = prefill_shared_prefix(model, layout)
            output = model.generate(input_ids=layout.input_ids, attention_mask=layout.attention_mask,
                                    do_sample=False, max_new_tokens=self.new_tokens, min_new_tokens=self.new_tokens,
                                    pad_token_id=tokenizer.pad_token_id,
                                    **({cache_argument(model): cache} if cache is not None else {}))
        return time.perf_counter() - started, (output.shape[1] - layout.input_ids.shape[1]) * len(batch)


async def bench(args: argparse.Namespace) -> list[Row]:
    """Start everything once, warm up, then measure serial, batched and raw at each concurrency."""
    with tempfile.TemporaryDirectory() as folder:
        settings = Settings(llm_backend="local", model=str(args.model), model_device_map="cpu", model_dtype=args.dtype,
                            database_path=Path(folder) / "bench.sqlite3", batch_size=args.batch_size,
                            max_new_tokens=args.new_tokens, turn_timeout_seconds=3600)
        backend = LocalLLM(settings.model, device_map="cpu", dtype=args.dtype, batch_size=args.batch_size,
                           batch_wait_ms=args.batch_wait_ms, min_new_tokens=args.new_tokens)
        batched = FixedReplyLLM(backend, args.new_tokens, one_at_a_time=False)
        services = await start_services(settings, llm=batched)
        try:
            return await measure(services, batched, args)
        finally:
            await services.close()


async def measure(services: Services, batched: FixedReplyLLM, args: argparse.Namespace) -> list[Row]:
    """The three modes at each concurrency, interleaved so that background noise hits them alike."""
    serial = FixedReplyLLM(batched.inner, args.new_tokens, one_at_a_time=True)
    agents = {"serial": Agent(serial, services.registry, services.tool_settings, services.memory,
                              services.agent.limits),
              "batched": services.agent}
    ceiling = RawCeiling(resolve_model(str(args.model)), args.dtype, args.batch_size, args.new_tokens)
    await agent_phase(services.agent, batched, 2, "warm-up")
    if args.grammar:  # the first grammar builds llguidance's view of the vocabulary (about a second)
        batched.constrained = True
        await agent_phase(services.agent, batched, 2, "warm-up")
        batched.constrained = False
    if not args.only_batched:
        await ceiling.load()
        await ceiling.run(batched.calls, 2, share_prefix=True)
    rows: list[Row] = []
    for chats in args.chats:
        level = [] if args.only_batched else [await agent_phase(agents["serial"], serial, chats, "serial")]
        batched.calls.clear()
        level.append(await agent_phase(agents["batched"], batched, chats, "batched"))
        if args.grammar:
            batched.constrained = True
            level.append(await agent_phase(agents["batched"], batched, chats, "batched, grammar"))
            batched.constrained = False
        if not args.only_batched:
            level.append(await ceiling.run(list(batched.calls), chats, share_prefix=True))
        if not args.skip_padded and not args.only_batched:
            level.append(await ceiling.run(list(batched.calls), chats, share_prefix=False))
        print(*(row.markdown() for row in level), sep="\n", file=sys.stderr, flush=True)
        rows.extend(level)
    return rows


def grammar_cost(rows: list[Row]) -> list[str]:
    """At each concurrency measured with and without the grammar: the tokens/s the grammar costs (need <= 15%).

    Repeated levels (`--chats 8 8 8`) are pooled: tokens and seconds summed per mode, so the A/B/A/B runs even out
    the noise of a shared machine.
    """
    lines = []
    for chats in sorted({row.chats for row in rows}):
        pooled = {mode: pooled_rate([r for r in rows if r.chats == chats and r.mode == mode])
                  for mode in ("batched", "batched, grammar")}
        if all(pooled.values()):
            cost = 1 - pooled["batched, grammar"] / pooled["batched"]
            lines.append(f"at {chats} chats: batched {pooled['batched']:.1f} tokens/s, under the grammar "
                         f"{pooled['batched, grammar']:.1f}: the grammar costs {cost:.1%} (need <= 15%): "
                         f"{'PASS' if cost <= 0.15 else 'FAIL'}")
    return lines


def pooled_rate(rows: list[Row]) -> float:
    """Tokens per second over several runs together; 0 for none."""
    seconds = sum(row.seconds for row in rows)
    return sum(row.tokens for row in rows) / seconds if seconds else 0.0


def verdict(rows: list[Row], chats: int) -> str:
    """The acceptance check at `chats` concurrent chats."""
    by_mode = {row.mode: row for row in rows if row.chats == chats}
    if not {"serial", "batched", "raw, shared prefix"} <= by_mode.keys():
        return f"(no run at {chats} chats)"
    batched = by_mode["batched"]
    speedup = batched.tokens_per_second / by_mode["serial"].tokens_per_second
    share = batched.tokens_per_second / by_mode["raw, shared prefix"].tokens_per_second
    ok = speedup >= 3 and share >= 0.85 and (batched.lag_p99_ms or 0) < 50
    return (f"at {chats} chats: batched = {speedup:.2f}x serial (need >= 3), {share:.0%} of the raw generate "
            f"of the same batches (need >= 85%), loop lag p99 {batched.lag_p99_ms:.1f} ms (need < 50): "
            f"{'PASS' if ok else 'FAIL'}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print a Markdown table (progress goes to stderr)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="MODEL: a .gguf file, folder or hub id")
    parser.add_argument("--chats", type=int, nargs="+", default=[1, 4, 8, 16], help="concurrent chats per run")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated by every model call")
    parser.add_argument("--batch-size", type=int, default=8, help="BATCH_SIZE of the model thread")
    parser.add_argument("--batch-wait-ms", type=int, default=20, help="BATCH_WAIT_MS of the model thread")
    parser.add_argument("--dtype", default="auto", help="MODEL_DTYPE (auto = float32 on a CPU)")
    parser.add_argument("--skip-padded", action="store_true",
                        help="skip the plain left-padded raw runs (slow: every row computes the whole prompt)")
    parser.add_argument("--grammar", action="store_true",
                        help="also run batched under the step grammar (llguidance masks), to measure what it costs")
    parser.add_argument("--only-batched", action="store_true",
                        help="skip the serial and raw runs (with --grammar: the grammar's cost alone)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows = asyncio.run(bench(args))
    print(f"model {args.model.name}, {args.new_tokens} new tokens per call, batch size {args.batch_size}, "
          f"batch wait {args.batch_wait_ms} ms, dtype {args.dtype}, {time.perf_counter() - started:.0f} s in all\n")
    print("| chats | mode | tokens | seconds | tokens/s | turn p50 s | turn p95 s | loop lag p99 ms |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(*(row.markdown() for row in rows), sep="\n")
    print("", *grammar_cost(rows), sep="\n")
    if not args.only_batched:
        print("\n" + verdict(rows, 8))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
