"""How closely each MODEL_DTYPE follows float32 on the eval's prompts, and how fast it is: the evidence behind
what `MODEL_DTYPE=auto` picks (engine/loading.py).

The prompts are the agent's first ReAct prompts for the questions of an eval file (`evals/courses.jsonl` by
default), all in one batch through the real local backend (the model thread, its batch, the prefix store off),
greedy, without a grammar, `--new-tokens` tokens each, end tokens banned so that every row runs its full length.
Each dtype runs in a process of its own (its load and its memory are its own). Against float32's tokens, per
dtype:

    same rows     rows whose whole continuation is float32's
    same tokens   tokens before a row's first difference, over all tokens (the share a user sees unchanged)
    tokens/s      the batch's tokens over its time (prefill included), after a warm-up batch
    peak RSS      the process's peak resident memory, load included

    .venv/bin/python bench/dtype_agreement.py                        # test GGUF: float32 bfloat16 int8 int4
    .venv/bin/python bench/dtype_agreement.py --model .cache/models/qwen2.5-0.5b-shape.Q4_K_M.gguf --dtypes float32 int8

On the sized models (random weights) agreement means little: their scores are near-uniform, so any rounding flips
near-ties; their rows give the speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


async def eval_prompts(path: Path, limit: int) -> list[list[dict[str, Any]]]:
    """The agent's first prompt for each of the first `limit` questions of an eval file."""
    from bench.react_turns import Question, first_prompt
    from db import open_database
    from tools import build_registry
    from tools.registry import tools_for_turn

    questions = [json.loads(line)["q"] for line in path.read_text().splitlines() if line.strip()][:limit]
    with tempfile.TemporaryDirectory() as folder:
        database = await open_database(Path(folder) / "bot.sqlite3")
        try:
            tools = await tools_for_turn(build_registry(database))
            return [first_prompt(Question(number, text, None), tools) for number, text in enumerate(questions)]
        finally:
            await database.close()


async def generate(model: str, dtype: str, prompts: list[list[dict[str, Any]]], new_tokens: int,
                   converted: str) -> dict[str, Any]:
    """Every prompt once in one batch (a warm-up batch first); the token ids of each row, and the timing."""
    from agent.llm.base import ModelRequest
    from agent.llm.local import LocalLLM

    llm = LocalLLM(model, device_map="cpu", dtype=dtype, batch_size=len(prompts), batch_wait_ms=200,
                   min_new_tokens=new_tokens, converted_dir=Path(converted), prefix_cache_mb=0)
    await llm.start()
    try:
        await asyncio.gather(*(llm.complete(ModelRequest(p, max_new_tokens=4)) for p in prompts[:2]))
        started = time.perf_counter()
        replies = await asyncio.gather(*(llm.complete(ModelRequest(p, max_new_tokens=new_tokens)) for p in prompts))
        seconds = time.perf_counter() - started
        tokenizer = llm._counter  # the event loop's own copy of the tokenizer
        rows = [tokenizer(reply.text, add_special_tokens=False)["input_ids"] for reply in replies]
    finally:
        await llm.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"dtype": dtype, "rows": rows, "tokens": sum(r.completion_tokens for r in replies), "seconds": seconds,
            "peak_rss_mb": peak >> 20}


def _run(model: str, dtype: str, prompts: list, new_tokens: int, converted: str, queue: Any) -> None:
    queue.put(asyncio.run(generate(model, dtype, prompts, new_tokens, converted)))


def in_own_process(*args: Any) -> dict[str, Any]:
    """`generate` in a fresh process (spawned: its imports, load and memory are its own)."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_run, args=(*args, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def agreement(rows: list[list[int]], reference: list[list[int]]) -> tuple[int, float]:
    """Rows equal to the reference's, and the share of tokens before each row's first difference."""
    same_rows, same_tokens, total = 0, 0, 0
    for mine, theirs in zip(rows, reference):
        prefix = next((index for index, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        same_rows += mine == theirs
        same_tokens += prefix
        total += len(theirs)
    return same_rows, same_tokens / max(total, 1)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every dtype, print one line each (and the JSON rows with --json)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--evals", type=Path, default=ROOT / "evals" / "courses.jsonl")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "int8", "int4"])
    parser.add_argument("--converted-dir", default=str(ROOT / ".cache" / "converted-models"))
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    prompts = asyncio.run(eval_prompts(args.evals, args.questions))
    results = {}
    for dtype in args.dtypes:
        results[dtype] = in_own_process(args.model, dtype, prompts, args.new_tokens, args.converted_dir)
        print(f"ran {dtype}", file=sys.stderr, flush=True)
    reference = results[args.dtypes[0]]["rows"]
    print(f"{Path(args.model).name}: {len(prompts)} prompts x {args.new_tokens} tokens, one batch; "
          f"against {args.dtypes[0]}")
    print("| dtype | same rows | same tokens | tokens/s | peak RSS MiB |\n| --- | ---: | ---: | ---: | ---: |")
    for dtype, result in results.items():
        rows, share = agreement(result["rows"], reference)
        result.update(same_rows=rows, same_token_share=round(share, 3))
        print(f"| {dtype} | {rows}/{len(prompts)} | {share:.0%} | {result['tokens'] / result['seconds']:.1f} | "
              f"{result['peak_rss_mb']} |")
    if args.json:
        args.json.write_text("\n".join(json.dumps({k: v for k, v in r.items() if k != "rows"}) for r in
                                       results.values()) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
