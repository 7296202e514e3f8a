"""What history summaries cost the turns: p95 turn latency with 8 chats, summaries on against off, on the local engine.

    .venv/bin/python bench/bench_summaries.py                     # 8 chats x 6 turns, 3 runs each way, alternating
    .venv/bin/python bench/bench_summaries.py --chats 8 --turns 6 --repeat 3 --new-tokens 8 --think 3 --dtype auto

The offline test model (SmolLM2-135M GGUF) runs on the real engine (`LocalLLM`: the model thread, fair admission,
the prefix store) and does real work for every call: each turn's two calls generate exactly `--new-tokens` tokens
on the agent's real prompt, and each summary generates up to `--summary-tokens` tokens at LOW priority, through the
same model thread, competing for the same batches (bench/react_turns.py's `ScriptedReact`: the model is far too
small to follow the ReAct format, so the text the agent reads is scripted, not its cost). A scripted model with
token delays would not do here: its calls do not share a machine, so a summary could never slow a turn.

Each chat's user reads an answer and types the next question for `--think` seconds (not part of a turn's latency):
a summary runs only while no question waits or runs (engine/admission.py), and it is in those pauses that it does,
and that a question arriving meanwhile pays for it (the step in progress, or the summary's prompt being read). Without
pauses the model is never free of questions, and every summary would simply wait for the end of the run.

The history budget is set low (`--budget`, `--keep`) so that summaries come often: with the defaults each chat's
history is folded every two or three turns once it has filled, far more often than with HISTORY_TOKEN_BUDGET=2000;
a conservative load. Runs alternate off/on so that a change in the machine's load touches both. Each run has a
fresh database and distinct questions; the model is loaded once. The table says how many summaries were written
while the chats went on, and how many only after their last turn.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from agent.llm.base import Completion, ModelRequest, Priority  # noqa: E402
from agent.llm.local import LocalLLM  # noqa: E402
from agent.loop import Agent  # noqa: E402
from agent.memory import Memory, Session  # noqa: E402
from agent.summaries import Summarizer  # noqa: E402
from bench.bench_local import load_average, machine_facts  # noqa: E402
from bench.measures import percentile  # noqa: E402
from bench.react_turns import Question, ScriptedReact, one_turn, question  # noqa: E402
from bot.program.config import Settings  # noqa: E402
from bot.program.services import agent_limits, summary_limits  # noqa: E402
from db import open_database  # noqa: E402
from tests.real_model import GGUF  # noqa: E402
from tools import build_registry  # noqa: E402
from tools.settings import ToolSettings  # noqa: E402

SUMMARY_TEXT = "用户问了几门课程的课时、每周更新次数和每次更新的小时数，助手查了课程数据库逐一回答。"


class SummarisingReact(ScriptedReact):
    """`ScriptedReact`, and for a summary call (LOW priority) a real generation of up to `summary_tokens` tokens on
    the summary prompt, answered with a fixed summary."""

    def __init__(self, inner: LocalLLM, new_tokens: int, summary_tokens: int):
        super().__init__(inner, new_tokens)
        self.summary_tokens = summary_tokens
        self.summaries: list[tuple[int, float]] = []  # (tokens generated, seconds) per summary

    async def complete(self, request: ModelRequest) -> Completion:
        if request.priority != Priority.LOW:
            return await super().complete(request)
        started = time.perf_counter()
        real = await self.inner.complete(ModelRequest(request.messages, max_new_tokens=self.summary_tokens,
                                                      user_key=request.user_key, priority=Priority.LOW))
        self.summaries.append((real.completion_tokens, time.perf_counter() - started))
        return Completion(SUMMARY_TEXT, real.prompt_tokens, real.completion_tokens)


async def chat(agent: Agent, session_id: str, questions: Sequence[Question], think: float,
               latencies: list[float]) -> None:
    """One chat: its questions in order, `think` seconds between an answer and the next question."""
    for index, asked in enumerate(questions):
        if index:
            await asyncio.sleep(think)
        latencies.append(await one_turn(agent, Session(id=session_id, chat_key="bench"), asked))


async def one_run(llm: SummarisingReact, settings: Settings, args: argparse.Namespace, first: int) -> dict[str, Any]:
    """`args.chats` chats of `args.turns` turns each on a fresh database; the latencies and what the summaries
    did."""
    chats, turns = args.chats, args.turns
    with tempfile.TemporaryDirectory() as folder:
        db = await open_database(Path(folder) / "bench.sqlite3")
        try:
            registry = build_registry(db)
            memory = Memory(db)
            summarizer = Summarizer(llm, memory, settings.agent.history_token_budget, summary_limits(settings))
            agent = Agent(llm, registry, ToolSettings(db, registry), memory, agent_limits(settings),
                          summarizer=summarizer)
            plan = {f"bench:{first}:{chat}": [question(first + chat * turns + turn) for turn in range(turns)]
                    for chat in range(chats)}
            llm.expect([asked for questions in plan.values() for asked in questions])
            before, latencies, started = len(llm.summaries), [], time.perf_counter()
            await asyncio.gather(*(chat(agent, key, questions, args.think, latencies)
                                   for key, questions in plan.items()))
            seconds, during = time.perf_counter() - started, len(llm.summaries) - before
            await summarizer.idle()
            stored = (await db.fetchone("SELECT count(*) FROM session_summaries"))[0]
        finally:
            await db.close()
    summaries = llm.summaries[before:]
    return {"seconds": seconds, "p50": percentile(latencies, 0.5), "p95": percentile(latencies, 0.95),
            "turns": len(latencies), "summaries": len(summaries), "during": during,
            "summary_tokens": sum(tokens for tokens, _ in summaries),
            "summary_p50_s": percentile([seconds for _, seconds in summaries], 0.5), "sessions_summarised": stored}


async def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Alternating runs, summaries off then on, `args.repeat` times each."""
    inner = LocalLLM(str(args.model), device_map="cpu", dtype=args.dtype, batch_size=args.batch_size,
                     batch_wait_ms=20, min_new_tokens=args.new_tokens, prefix_cache_mb=512,
                     low_priority_rows=args.low_rows)
    llm = SummarisingReact(inner, args.new_tokens, args.summary_tokens)
    await llm.start()
    rows, first = [], 0
    try:
        for repeat in range(args.repeat):
            for enabled in (False, True):
                settings = Settings.of(max_new_tokens=args.new_tokens, turn_timeout_seconds=3600,
                                       constrained_decoding=False, history_token_budget=args.budget,
                                       summary_keep_tokens=args.keep, summary_enabled=enabled,
                                       summary_max_tokens=args.summary_tokens)
                load = load_average()
                row = await one_run(llm, settings, args, first)
                first += args.chats * args.turns
                rows.append(row | {"summaries_on": enabled, "repeat": repeat, "load": load})
                print(f"  {'on ' if enabled else 'off'} #{repeat}: p95 {row['p95']:.2f} s, p50 {row['p50']:.2f} s, "
                      f"{row['summaries']} summaries ({row['during']} during the chats, {row['summary_tokens']} "
                      f"tokens), load {load}",
                      file=sys.stderr, flush=True)
    finally:
        await llm.close()
    return rows


def report(rows: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    """The result as bench/README.md shows it: a line per run, then the medians and the verdict."""
    lines = ["| run | summaries | turns | turn p50 s | turn p95 s | run s | summaries written (during the chats) | "
             "summary tokens | summary p50 s | load (1/5/15 min) before |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row['repeat'] + 1} | {'on' if row['summaries_on'] else 'off'} | {row['turns']} | "
                     f"{row['p50']:.2f} | {row['p95']:.2f} | {row['seconds']:.1f} | {row['summaries']} "
                     f"({row['during']}) | {row['summary_tokens']} | {_seconds(row['summary_p50_s'])} | "
                     f"{row['load']} |")
    off = sorted(row["p95"] for row in rows if not row["summaries_on"])
    on = sorted(row["p95"] for row in rows if row["summaries_on"])
    off_p95, on_p95 = off[len(off) // 2], on[len(on) // 2]
    added = (on_p95 / off_p95 - 1) * 100
    verdict = "within" if added <= 10 else "over"
    lines += ["", f"Median p95 turn latency: {off_p95:.2f} s without summaries, {on_p95:.2f} s with them: "
                  f"{added:+.1f}% ({verdict} the 10% the issue allows). {args.chats} chats x {args.turns} turns, "
                  f"{args.new_tokens} tokens a call, {args.think:g} s between a chat's turns, summaries of up to "
                  f"{args.summary_tokens} tokens, "
                  f"HISTORY_TOKEN_BUDGET={args.budget}, SUMMARY_KEEP_TOKENS={args.keep}, "
                  f"LOW_PRIORITY_ROWS={args.low_rows}, BATCH_SIZE={args.batch_size}, MODEL_DTYPE={args.dtype}."]
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=GGUF, help="a .gguf file or model folder (default: SmolLM2)")
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6, help="turns per chat, one after another")
    parser.add_argument("--think", type=float, default=3.0, help="seconds between an answer and the chat's next "
                                                                 "question")
    parser.add_argument("--repeat", type=int, default=3, help="runs each way (off, on, off, on, ...)")
    parser.add_argument("--new-tokens", type=int, default=8, help="tokens each turn's call generates")
    parser.add_argument("--summary-tokens", type=int, default=48, help="SUMMARY_MAX_TOKENS")
    parser.add_argument("--budget", type=int, default=300, help="HISTORY_TOKEN_BUDGET (low: summaries come often)")
    parser.add_argument("--keep", type=int, default=150, help="SUMMARY_KEEP_TOKENS")
    parser.add_argument("--low-rows", type=int, default=1, help="LOW_PRIORITY_ROWS")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--dtype", default="auto", help="MODEL_DTYPE")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the bench and print its table for bench/README.md."""
    args = parse(argv)
    facts = machine_facts()
    print(f"bench_summaries: {facts['cpu']}, {facts['nproc']} cores, load {facts['load_before']}", file=sys.stderr)
    rows = asyncio.run(bench(args))
    print(f"Machine: {facts['cpu']}, {facts['nproc']} cores ({os.uname().machine}); load before "
          f"{facts['load_before']}, after {load_average()}.\n")
    print(report(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
