"""Benchmark: `docs_search` over 10,000 chunks — how long adding takes, and each search's latency (p50, p95, p99).

The documents are made from the real corpus (evals/docs/corpus/): each is a Markdown file whose sections take their
headings and sentences, Chinese and English, from the corpus at random (seeded), so the index holds the words and
the mix of the real documents at 10,000 chunks. They are added through the library as files are (conversion,
chunks, index, one transaction each), a fifth of them global and the rest spread over 20 chats. The questions of
evals/docs.jsonl are then asked as the tool asks them (`DocsTools.search`: query, BM25, formatting within
OBSERVATION_MAX_CHARS) from one of those chats, over and over, one at a time; what is reported is the time per
call, with the machine's load beside it.

    .venv/bin/python bench/bench_docs.py
    .venv/bin/python bench/bench_docs.py --chunks 10000 --rounds 20 --tokenizer trigram
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.program.audit import insert_audit  # noqa: E402
from bot.program.retrieval import load_retrieval_cases  # noqa: E402
from db import open_database  # noqa: E402
from tools.docs import DocsTools  # noqa: E402
from tools.docs_chunks import chunk_document  # noqa: E402
from tools.docs_convert import ArchiveLimits, Heading, convert  # noqa: E402
from tools.docs_index import DEFAULT_FORM, FORMS  # noqa: E402
from tools.docs_store import DocsLimits, DocumentLibrary, Upload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "evals" / "docs" / "corpus"
QUESTIONS = ROOT / "evals" / "docs.jsonl"
SECTIONS_PER_DOCUMENT = 40
CHATS = 20


def corpus_material() -> tuple[list[str], list[str]]:
    """The corpus's headings and sentences (Chinese and English), to build documents from."""
    headings, sentences = [], []
    for path in sorted(CORPUS.glob("*.md")):
        converted = convert(path.name, path.read_bytes(), ArchiveLimits(10**9, 10**9))
        headings += [block.text for block in converted.blocks if isinstance(block, Heading)]
        for chunk in chunk_document(converted, 10**6):
            sentences += [s.strip() for s in re.split(r"(?<=[。！？])|(?<=[.!?])\s+", chunk.text) if len(s.strip()) > 8]
    return headings, sentences


def make_document(number: int, rng: random.Random, headings: list[str], sentences: list[str],
                  chunk_chars: int) -> str:
    """A Markdown document of SECTIONS_PER_DOCUMENT sections, each about one chunk of text."""
    lines = [f"# {rng.choice(headings)} ({number})", ""]
    for section in range(SECTIONS_PER_DOCUMENT):
        lines += [f"## {rng.choice(headings)} {section}", ""]
        paragraph = ""
        while len(paragraph) < chunk_chars * 0.8:
            paragraph += rng.choice(sentences) + " "
        lines += [paragraph.strip()[:chunk_chars - 10], ""]
    return "\n".join(lines)


def percentile(values: list[float], share: float) -> float:
    """The value below which `share` of `values` fall (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * len(ordered) + 0.5)) - 1)]


def machine() -> str:
    """The CPU, its cores, and the load average when the searches ran."""
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo", encoding="utf-8")
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor()
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return f"{model or 'unknown CPU'}, {os.cpu_count()} cores, load average {load}"


async def run(args: argparse.Namespace) -> None:
    limits = DocsLimits(max_total_bytes=10**10)
    headings, sentences = corpus_material()
    rng = random.Random(args.seed)
    questions = [case.question for case in load_retrieval_cases(QUESTIONS)]
    with tempfile.TemporaryDirectory() as folder:
        db = await open_database(Path(folder) / "bench.sqlite3")
        try:
            library = DocumentLibrary(db, limits, audit=insert_audit)
            if FORMS[args.tokenizer] is not DEFAULT_FORM:
                await library.rebuild_index(FORMS[args.tokenizer])
            started, chunks, number = time.perf_counter(), 0, 0
            while chunks < args.chunks:
                number += 1
                scope = "global" if number % 5 == 0 else f"tg:-100{number % CHATS}"
                text = make_document(number, rng, headings, sentences, limits.chunk_chars)
                added = await library.add(Upload(f"doc-{number}.md", text.encode(), scope=scope))
                chunks += added.document.chunk_count
            indexed = time.perf_counter() - started
            tools = DocsTools(library, args.observation_chars)
            for question in questions:  # warm the page cache: the first pass reads the index from disk
                await tools.search(question, "tg:-1001")
            times = []
            for _ in range(args.rounds):
                for question in questions:
                    began = time.perf_counter()
                    await tools.search(question, "tg:-1001")
                    times.append((time.perf_counter() - began) * 1000)
            size = (Path(folder) / "bench.sqlite3").stat().st_size
        finally:
            await db.close()
    print(f"tokenizer {args.tokenizer}: {chunks} chunks in {number} documents, added in {indexed:.1f} s "
          f"({chunks / indexed:.0f} chunks/s); database {size / 2**20:.0f} MiB")
    print(f"docs_search, {len(times)} calls ({len(questions)} questions x {args.rounds}): "
          f"p50 {statistics.median(times):.1f} ms, p95 {percentile(times, 0.95):.1f} ms, "
          f"p99 {percentile(times, 0.99):.1f} ms, max {max(times):.1f} ms")
    print(f"machine: {machine()}; Python {platform.python_version()}, SQLite {__import__('sqlite3').sqlite_version}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=10_000, help="chunks to index (default 10,000)")
    parser.add_argument("--rounds", type=int, default=10, help="times each question is asked (default 10)")
    parser.add_argument("--tokenizer", choices=sorted(FORMS), default=DEFAULT_FORM.name)
    parser.add_argument("--observation-chars", type=int, default=2000, help="OBSERVATION_MAX_CHARS (default 2000)")
    parser.add_argument("--seed", type=int, default=39)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
