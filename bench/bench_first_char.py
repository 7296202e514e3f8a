"""Benchmark: time to the first visible character of the answer, before streaming and with it.

One question, answered directly (no tools enabled in the bench chat, so the whole reply is the answer and streams),
through the real agent, on the local backend (the offline GGUF on this CPU) and, with --server, through an
OpenAI-compatible server (llama.cpp's Python server on the same GGUF). For each run:

    first char   from the question to the first `AnswerText` event: what a user sees first, with streaming
    whole answer from the question to the end of the turn: when, without streaming, the first character appeared
    no listener  the same turn with nobody listening (nothing streams): the turn's time before this change

With the local backend it also times the streaming hook by itself: what `TextStream.push` (the incremental
decoding each streaming row does on the model thread after every token) costs per token.

    .venv/bin/python bench/bench_first_char.py
    .venv/bin/python bench/bench_first_char.py --server http://127.0.0.1:8766/v1 --server-model smol --skip-local
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.events import AnswerText, TurnEvent  # noqa: E402
from agent.llm.base import LLM  # noqa: E402
from agent.llm.engine.text_stream import TextStream  # noqa: E402
from agent.loop import Session  # noqa: E402
from bot.program.config import Settings  # noqa: E402
from bot.program.services import Services, build_llm, start_services  # noqa: E402

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = "What is the capital of France? Answer in two sentences."
CHAT = "bench-first-char"


@dataclass
class Timing:
    """One turn: seconds to the first answer character and to the end, and how long the answer was."""

    first_char: float | None
    whole: float
    characters: int


class FirstCharacter:
    """A turn's listener that notes when the first answer text arrives."""

    def __init__(self, started: float):
        self.started = started
        self.at: float | None = None

    def __call__(self, event: TurnEvent) -> None:
        if isinstance(event, AnswerText) and event.text and self.at is None:
            self.at = time.perf_counter() - self.started


async def one_turn(services: Services, number: int, listen: bool) -> Timing:
    """Ask once in a fresh session; time it."""
    session = Session(id=f"{CHAT}:{number}:{listen}", chat_key=CHAT)
    started = time.perf_counter()
    listener = FirstCharacter(started) if listen else None
    result = await services.agent.run(session, QUESTION, on_event=listener)
    return Timing(listener.at if listener else None, time.perf_counter() - started, len(result.answer))


def hook_microseconds(tokenizer: Any, tokens: int = 512) -> float:
    """Microseconds per token of `TextStream.push` on real text (Chinese and English), with a sink that does
    nothing: the model thread's share of streaming a row (the hand-over is one `call_soon_threadsafe`)."""
    text = ("大模型技术实战课程目前一共上线了200节，每周更新3次，每次2小时。"
            "Thought: I need the course table.\nAction: course_query\n") * 40
    ids = tokenizer.encode(text, add_special_tokens=False)[:tokens]
    stream = TextStream(tokenizer, lambda piece: None)
    started = time.perf_counter()
    for token_id in ids:
        stream.push(token_id)
    return (time.perf_counter() - started) / len(ids) * 1e6


async def measure(name: str, settings: Settings, llm: LLM, repeat: int) -> list[str]:
    """Warm up, then `repeat` listened and unlistened turns, interleaved; one Markdown row per kind."""
    services = await start_services(settings, llm=llm)
    try:
        for tool in services.registry:
            await services.tool_settings.set_enabled(tool.name, False, CHAT)
        await one_turn(services, -1, True)  # warm-up: first calls load caches
        listened, plain = [], []
        for number in range(repeat):
            listened.append(await one_turn(services, number, True))
            plain.append(await one_turn(services, number, False))
            print(f"{name} #{number}: first char {listened[-1].first_char}, whole {listened[-1].whole:.2f} s, "
                  f"no listener {plain[-1].whole:.2f} s", file=sys.stderr, flush=True)
    finally:
        await services.close()
    firsts = [t.first_char for t in listened if t.first_char is not None]
    median = statistics.median
    return [f"| {name} | {repeat} | {median(firsts):.2f} | {median(t.whole for t in listened):.2f} | "
            f"{median(t.whole for t in plain):.2f} | {median(t.characters for t in listened):.0f} |"]


def settings_for(args: argparse.Namespace, folder: str, backend: str) -> Settings:
    """The bench's settings: a temporary database, the chosen backend, short answers."""
    return Settings.of(llm_backend=backend, model=str(args.model), model_device_map="cpu",
                       database_path=Path(folder) / f"{backend}.sqlite3", max_new_tokens=args.max_new_tokens,
                       openai_base_url=args.server or "http://127.0.0.1:8000/v1", openai_model=args.server_model,
                       turn_timeout_seconds=3600)


async def bench(args: argparse.Namespace) -> list[str]:
    """The local backend, then the server, each measured alone."""
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        if not args.skip_local:
            settings = settings_for(args, folder, "local")
            local = build_llm(settings)
            rows += await measure("local (transformers, this CPU)", settings, local, args.repeat)
            costs = [hook_microseconds(local._counter) for _ in range(5)]  # type: ignore[attr-defined]
            print(f"streaming hook: TextStream.push {statistics.median(costs):.0f} µs per token (median of 5 x "
                  "512 tokens)", file=sys.stderr, flush=True)
        if args.server:
            settings = settings_for(args, folder, "openai")
            rows += await measure(f"server ({args.server})", settings, build_llm(settings), args.repeat)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print a Markdown table (progress goes to stderr)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="MODEL for the local backend")
    parser.add_argument("--server", default="", help="OPENAI_BASE_URL of a server to measure too")
    parser.add_argument("--server-model", default="smol", help="OPENAI_MODEL on that server")
    parser.add_argument("--skip-local", action="store_true", help="measure only the server")
    parser.add_argument("--repeat", type=int, default=5, help="turns of each kind")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="MAX_NEW_TOKENS of each answer")
    args = parser.parse_args(argv)
    rows = asyncio.run(bench(args))
    print(f"question {QUESTION!r}, {args.max_new_tokens} new tokens at most, median of {args.repeat}\n")
    print("| backend | turns | first character s (streamed) | whole answer s (= first character before) | "
          "turn without listener s | answer characters |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print(*rows, sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
