"""Benchmark: the agent's real ReAct turns on our local engine, side by side with any OpenAI-compatible server.

Each contender runs in a process of its own (bench/contenders.py) and gets the same rows, interleaved (repeat by
repeat, concurrency by concurrency, contender by contender) so that background noise hits them alike:

    local              our local backend (`LocalLLM`), prefix cache on (PREFIX_CACHE_MB, --prefix-cache-mb)
    local, no cache    the same with PREFIX_CACHE_MB=0 (a batch still computes the prefix its rows share once)
    local, streamed    `local` with a listener on every turn, as Telegram and the terminal have: every row streams
                       its text as it is generated (--modes local local-streamed: what the streaming hook costs)
    local, grammar     (--modes local-grammar) "local" with every call decoded under the agent's step grammar
                       (agent/grammar.py; llguidance masks per row): what constrained decoding costs
    local, int8        (--modes local-int8) "local" with MODEL_DTYPE=int8: int8 linear layers on a CPU
    local, fp32        (--modes local-fp32) "local" with MODEL_DTYPE=float32: exact, where `auto` picks bf16
    local, no drafts   (--modes local-nodrafts) "local" with SPECULATIVE_TOKENS=0: one token per row a step
    raw generate       the ceiling: the same prompts through `generate_rows` directly, no agent around it
    --openai URL       our openai backend (`OpenAILLM`) against a server: llama.cpp's, vLLM, anything

A row: `chats` chats at once, each asking `--turns` distinct course questions in order (bench/react_turns.py: a
real generation of exactly --new-tokens tokens per call, then a scripted ReAct reply, so every engine sees the same
two calls per turn), then a first-token probe: max(1, chats - 1) other chats generate --probe-tokens tokens each
while 1-token calls arrive every --probe-gap seconds (no streaming yet: a 1-token call's completion time is its
time to first token). Before the rows, every contender answers one warm-up round; before everything, two fresh
processes time `LocalLLM.start()` on the GGUF: the first converts it, the second loads the converted copy.

    .venv/bin/python bench/bench_local.py                                   # our engine: 1 and 8 chats, 2 repeats
    .venv/bin/python bench/bench_local.py --openai http://127.0.0.1:8771/v1 --openai-label llama-server
    .venv/bin/python bench/bench_local.py --chats 1 2 --turns 1 --new-tokens 4 --probe-tokens 16 --repeat 1
    bash bench/run_vs_llamacpp.sh                                           # both llama.cpp servers, one command
    .venv/bin/python bench/bench_local.py --modes local local-grammar --probe-tokens 0 --no-startup  # grammar cost
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.contenders import RowPlan, Spec, describe, serve  # noqa: E402
from bench.measures import median  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
MODES = {"local": "local", "local-nocache": "local, no cache", "local-streamed": "local, streamed",
         "raw": "raw generate", "local-grammar": "local, grammar", "local-int8": "local, int8",
         "local-fp32": "local, fp32", "local-nodrafts": "local, no drafts", "local-int4": "local, int4",
         "local-bf16": "local, bf16"}
# Modes that fix MODEL_DTYPE whatever --dtype says: exact fp32 beside `auto`, and each other mode auto may pick.
MODE_DTYPES = {"local-int8": "int8", "local-fp32": "float32", "local-int4": "int4", "local-bf16": "bfloat16"}
# Tokens that end a llama.cpp generation besides the GGUF's eos/eot ids (llama-vocab.cpp treats these as "end of
# generation" by their text).
END_TOKEN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|return|>", "</s>")


class Contender:
    """The parent's handle on one contender process."""

    def __init__(self, spec: Spec):
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: torch is not forked
        self.spec = spec
        self._conn, child = context.Pipe()
        self._process = context.Process(target=serve, args=(spec, child), name=spec.label, daemon=True)
        started = time.perf_counter()
        self._process.start()
        child.close()  # ours is gone, so a dead child reads as EOF, not as a wait forever
        self.facts = self._answer("ready")
        self.facts["ready_s"] = time.perf_counter() - started  # from spawning: imports and loading included

    def row(self, plan: RowPlan) -> dict[str, Any]:
        """Run one row in the contender and return its measurements."""
        self._conn.send(("row", plan))
        return self._answer("row")

    def close(self) -> None:
        """Tell the contender to stop, and wait for it."""
        if self._process.is_alive():
            try:
                self._conn.send(("close", None))
            except OSError:
                pass
        self._process.join(timeout=60)
        if self._process.is_alive():
            self._process.kill()

    def _answer(self, expected: str) -> dict[str, Any]:
        while not self._conn.poll(1.0):
            if not self._process.is_alive() and not self._conn.poll(0):
                raise SystemExit(f"bench: {self.spec.label} exited (code {self._process.exitcode}) without answering")
        try:
            kind, payload = self._conn.recv()
        except EOFError:
            raise SystemExit(f"bench: {self.spec.label} exited without answering") from None
        if kind != expected:
            raise SystemExit(f"bench: {payload}")
        return payload


def end_token_ids(gguf: Path) -> tuple[int, ...]:
    """The ids of every token that ends a llama.cpp generation with this GGUF: its eos/eot/eom ids and the
    end-of-turn tokens named in END_TOKEN_TEXTS."""
    from gguf import GGUFReader

    reader = GGUFReader(gguf)
    ids = {int(reader.fields[key].contents()) for key in ("tokenizer.ggml.eos_token_id",
                                                         "tokenizer.ggml.eot_token_id",
                                                         "tokenizer.ggml.eom_token_id") if key in reader.fields}
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    ids.update(index for index, text in enumerate(tokens) if text in END_TOKEN_TEXTS)
    return tuple(sorted(ids))


def specs(args: argparse.Namespace) -> list[Spec]:
    """The contenders, in the order they run in each round."""
    base = Spec(kind="local", label="", model=str(args.model), new_tokens=args.new_tokens,
                probe_tokens=args.probe_tokens, probe_gap=args.probe_gap, probes=args.probes, dtype=args.dtype,
                device_map=args.device_map, batch_size=args.batch_size, batch_wait_ms=args.batch_wait_ms,
                prefix_cache_mb=args.prefix_cache_mb, converted_dir=str(args.converted_dir),
                speculative_tokens=args.speculative_tokens, speculative_step_tokens=args.speculative_step_tokens)
    chosen = [replace(base, kind="raw" if mode == "raw" else "local", label=MODES[mode],
                      prefix_cache_mb=0 if mode == "local-nocache" else args.prefix_cache_mb,
                      listen=mode == "local-streamed", grammar=mode == "local-grammar",
                      dtype=MODE_DTYPES.get(mode, args.dtype),
                      speculative_tokens=0 if mode == "local-nodrafts" else args.speculative_tokens)
              for mode in args.modes]
    if args.openai:
        banned = tuple(args.ban_token_ids) if args.ban_token_ids is not None else end_token_ids(args.model)
        progress(f"openai contenders: end tokens {list(banned)} banned (logit_bias -100), so every call generates "
                 "exactly its max_tokens")
        for index, url in enumerate(args.openai):
            label = args.openai_label[index] if index < len(args.openai_label) else url
            pid = args.openai_pid[index] if index < len(args.openai_pid) else 0
            chosen.append(replace(base, kind="openai", label=label, openai_url=url, openai_model=args.openai_model,
                                  ban_token_ids=banned, server_pid=pid))
    return chosen


def startup_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """`LocalLLM.start()` in two fresh processes sharing a fresh converted-model folder: converting, converted;
    then `qwenbot ask` started twice as a user would, on that converted copy (the second start is the one timed)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-converted-") as folder:
        for mode in ("local start: converts the GGUF", "local start: converted copy"):
            spec = Spec(kind="startup", label=mode, model=str(args.model), new_tokens=args.new_tokens,
                        probe_tokens=0, dtype=args.dtype, device_map=args.device_map, converted_dir=folder)
            contender = Contender(spec)
            contender.close()
            rows.append({key: None for key in ROW_KEYS} | {
                "mode": mode, "chats": 0, "repeat": 0, "seconds": contender.facts["start_s"],
                "ready_s": contender.facts["ready_s"], "peak_rss_mb": contender.facts["peak_rss_mb"],
                "dtype": contender.facts.get("dtype")})
            progress(f"{mode}: LocalLLM.start() {contender.facts['start_s']:.1f} s, "
                     f"process ready {contender.facts['ready_s']:.1f} s")
        seconds = ask_ready_seconds(args, folder)
        rows.append({key: None for key in ROW_KEYS} | {"mode": ASK_START, "chats": 0, "repeat": 0,
                                                        "seconds": seconds, "ready_s": seconds})
        progress(f"{ASK_START}: {seconds:.1f} s from launch to the model loaded")
    return rows


ASK_START = "qwenbot ask: second start"
LOADED_LINE = "agent.llm.engine.loading: loaded "  # the log line load_model writes once the model can answer


def ask_ready_seconds(args: argparse.Namespace, converted: str) -> float:
    """Seconds from launching `qwenbot ask` to its model being loaded, at its second start in one DATA_DIR (the
    first creates the database); each run is stopped at that line, before its turn (the rows measure turns)."""
    qwenbot = Path(sys.executable).with_name("qwenbot")
    with tempfile.TemporaryDirectory(prefix="bench-ask-") as data:
        # An absolute MODEL: qwenbot reads a relative one against DATA_DIR, as a user's .env would mean it.
        env = os.environ | {"DATA_DIR": data, "LLM_BACKEND": "local", "MODEL": str(Path(args.model).resolve()),
                            "MODEL_CONVERTED_DIR": converted, "MODEL_DTYPE": args.dtype,
                            "MODEL_DEVICE_MAP": args.device_map, "LOG_LEVEL": "INFO",
                            "TOKENIZER_VOCAB_PATH": str(ROOT / "data" / "qwen.tiktoken")}
        return [_seconds_to_line([str(qwenbot), "ask", "--quiet", "你好"], env, LOADED_LINE) for _ in range(2)][-1]


def _seconds_to_line(command: list[str], env: dict[str, str], wanted: str) -> float:
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, errors="replace")
    last = ""
    try:
        for line in process.stderr:
            if wanted in line:
                return time.perf_counter() - started
            last = line.strip() or last
        raise SystemExit(f"bench: {' '.join(command[:2])} exited (code {process.wait()}) before logging {wanted!r}: "
                         f"{last}")
    finally:
        process.kill()
        process.wait()


class Plans:
    """Question numbers for every row: each row's block is its own, the same block for every contender."""

    def __init__(self, probes: int):
        self.probes = probes
        self.next = 0

    def plan(self, chats: int, turns: int, repeat: int, probe: bool = True) -> RowPlan:
        """The next row's plan."""
        plan = RowPlan(chats, turns, self.next, repeat, probe)
        self.next += chats * turns + max(1, chats - 1) + self.probes
        return plan


def bench(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Start-up rows, then every contender's rows; returns the rows and the run's facts."""
    facts = machine_facts()
    rows = [] if args.no_startup else startup_rows(args)
    contenders: list[Contender] = []
    try:
        for spec in specs(args):
            contenders.append(Contender(spec))
            progress(f"{spec.label}: ready in {contenders[-1].facts['ready_s']:.1f} s "
                     f"(start {contenders[-1].facts['start_s']:.1f} s)")
        plans = Plans(args.probes)
        warm_up = plans.plan(max(args.chats), 1, 0, probe=False)
        for contender in contenders:
            contender.row(warm_up)
        for repeat in range(1, args.repeat + 1):
            for chats in args.chats:
                plan = plans.plan(chats, args.turns, repeat)
                for contender in contenders:
                    row = measured_row(contender, plan)
                    rows.append(row)
                    progress(markdown_row(row, runs=1))
    finally:
        for contender in contenders:
            contender.close()
    facts["load_after"] = load_average()
    facts["contenders"] = [describe(c.spec) | {"start_s": round(c.facts["start_s"], 2),
                                               "dtype": c.facts.get("dtype")} for c in contenders]
    return rows, facts


# Every measured row has these keys (None where a contender does not measure it), in this order.
ROW_KEYS = ("mode", "chats", "repeat", "tokens", "seconds", "tokens_per_s", "turn_p50_s", "turn_p95_s",
            "first_token_p50_s", "prompt_tokens_computed", "prompt_tokens_reused", "peak_rss_mb")


def measured_row(contender: Contender, plan: RowPlan) -> dict[str, Any]:
    """One row from a contender, with the parent's own fields."""
    measured = contender.row(plan)
    measured["tokens_per_s"] = measured["tokens"] / measured["seconds"] if measured["seconds"] else None
    row = {key: None for key in ROW_KEYS} | measured
    return row | {"mode": contender.spec.label, "chats": plan.chats, "repeat": plan.repeat}


def machine_facts() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "nproc": os.cpu_count(), "load_before": load_average(), "python": platform.python_version()}


def load_average() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


COLUMNS = ("mode", "chats", "runs", "tokens", "seconds", "tokens/s", "turn p50 s", "turn p95 s", "first token p50 s",
           "step s", "prompt tokens / turn", "computed / turn", "computed %", "peak RSS MiB", "loop lag p99 ms")


def summarize(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], int]]:
    """One row per (mode, chats): the median of its repeats, and how many there were."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["mode"], row["chats"]), []).append(row)
    summary = []
    for (mode, chats), runs in groups.items():
        keys = {key for run in runs for key, value in run.items() if isinstance(value, (int, float))}
        merged: dict[str, Any] = {"mode": mode, "chats": chats}
        merged.update({key: median([run.get(key) for run in runs]) for key in keys - {"chats"}})
        summary.append((merged, len(runs)))
    return summary


def markdown_row(row: dict[str, Any], runs: int) -> str:
    """A row in the table's format; – for what the contender does not measure."""
    def number(key: str, digits: int = 2) -> str:
        value = row.get(key)
        return "–" if value is None else f"{value:.{digits}f}"

    turns = row.get("turns") or 0
    per_turn = (lambda key: "–" if row.get(key) is None or not turns else f"{row[key] / turns:.0f}")
    share = ("–" if row.get("prompt_tokens_computed") is None or not row.get("prompt_tokens_sent")
             else f"{100 * row['prompt_tokens_computed'] / row['prompt_tokens_sent']:.0f}%")
    cells = [row["mode"], str(row["chats"] or "–"), str(runs), number("tokens", 0), number("seconds"),
             number("tokens_per_s", 1), number("turn_p50_s"), number("turn_p95_s"), number("first_token_p50_s"),
             number("step_s", 3), per_turn("prompt_tokens_sent"), per_turn("prompt_tokens_computed"), share,
             number("peak_rss_mb", 0), number("loop_lag_p99_ms", 1)]
    return "| " + " | ".join(cells) + " |"


def table(rows: list[dict[str, Any]]) -> str:
    """The Markdown table of the medians."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "| --- | " + " | ".join("---:" for _ in COLUMNS[1:]) + " |"]
    startup = [row for row in rows if row["chats"] == 0]
    lines += [markdown_row(row, 1) for row in startup]
    lines += [markdown_row(row, runs) for row, runs in summarize([row for row in rows if row["chats"]])]
    return "\n".join(lines)


# Issue 37's lines: memory within 1.2 times the server's, and `qwenbot ask` ready within 3 s on its second start.
MEMORY_RATIO_LIMIT = 1.2
ASK_START_LIMIT_S = 3.0


def verdicts(rows: list[dict[str, Any]], chats_levels: Sequence[int]) -> list[str]:
    """The acceptance lines of issues 10 and 37, from the medians: ours ("local") against each server, and on its
    own."""
    medians = {(row["mode"], row["chats"]): row for row, _ in summarize([row for row in rows if row["chats"]])}
    ours = MODES["local"]
    low, high = min(chats_levels), max(chats_levels)
    servers = sorted({mode for mode, _ in medians} - set(MODES.values()))
    lines = []
    for server in servers:
        lines += _against(medians, ours, server, low, high)
    for chats in chats_levels:
        row = medians.get((ours, chats))
        if row and row.get("prompt_tokens_sent") and row.get("prompt_tokens_computed") is not None:
            share = row["prompt_tokens_computed"] / row["prompt_tokens_sent"]
            lines.append(_line(f"{_chats(chats)}: prompt tokens computed {share:.0%} of those sent (need <= 25%)",
                               share <= 0.25))
        if row and row.get("first_token_p50_s") is not None:
            limit = row["step_s"] + 1
            lines.append(_line(f"{_chats(chats)}: first token p50 {row['first_token_p50_s']:.2f} s, a batch step "
                               f"{row['step_s']:.3f} s (need <= step + 1 s)", row["first_token_p50_s"] <= limit))
        if row and row.get("loop_lag_p99_ms") is not None:
            lines.append(_line(f"{_chats(chats)}: event-loop lag p99 {row['loop_lag_p99_ms']:.1f} ms (need < 20)",
                               row["loop_lag_p99_ms"] < 20))
    lines += grammar_cost(medians, chats_levels)
    second = next((row for row in rows if row["mode"] == "local start: converted copy"), None)
    ask = next((row for row in rows if row["mode"] == ASK_START), None)
    if second and ask:
        lines.append(_line(f"second start: `qwenbot ask` to the model loaded {ask['seconds']:.1f} s "
                           f"(LocalLLM.start() {second['seconds']:.1f} s; the bench's own contender process "
                           f"{second['ready_s']:.1f} s) (need <= {ASK_START_LIMIT_S:g} s)",
                           ask["seconds"] <= ASK_START_LIMIT_S))
    return lines


def grammar_cost(medians: dict[tuple[str, int], dict[str, Any]], chats_levels: Sequence[int]) -> list[str]:
    """Issue 11's line: what decoding under the step grammar costs in tokens/s, "local, grammar" against "local"."""
    lines = []
    for chats in chats_levels:
        plain, constrained = medians.get((MODES["local"], chats)), medians.get((MODES["local-grammar"], chats))
        if plain and constrained and plain.get("tokens_per_s") and constrained.get("tokens_per_s"):
            cost = 1 - constrained["tokens_per_s"] / plain["tokens_per_s"]
            lines.append(_line(f"{chats} chats: under the step grammar {constrained['tokens_per_s']:.1f} tokens/s, "
                               f"{cost:.1%} below {plain['tokens_per_s']:.1f} (need <= 15%)", cost <= 0.15))
    return lines


def _against(medians: dict[tuple[str, int], dict[str, Any]], ours: str, server: str, low: int,
             high: int) -> list[str]:
    lines = []
    mine, theirs = medians.get((ours, low)), medians.get((server, low))
    if mine and theirs:
        lines.append(_line(f"{_chats(low)}: our turn p50 {mine['turn_p50_s']:.2f} s vs {server} "
                           f"{theirs['turn_p50_s']:.2f} s (need <=)", mine["turn_p50_s"] <= theirs["turn_p50_s"]))
    mine, theirs = medians.get((ours, high)), medians.get((server, high))
    if mine and theirs and high != low:
        ratio = mine["tokens_per_s"] / theirs["tokens_per_s"]
        lines.append(_line(f"{_chats(high)}: our {mine['tokens_per_s']:.1f} tokens/s = {ratio:.2f}x {server}'s "
                           f"{theirs['tokens_per_s']:.1f} (need >= 2x)", ratio >= 2))
        lines.append(_line(f"{_chats(high)}: our turn p95 {mine['turn_p95_s']:.2f} s vs {server} "
                           f"{theirs['turn_p95_s']:.2f} s (need lower)", mine["turn_p95_s"] < theirs["turn_p95_s"]))
    for chats in sorted({low, high}):
        mine, theirs = medians.get((ours, chats)), medians.get((server, chats))
        if mine and theirs and mine.get("peak_rss_mb") and theirs.get("peak_rss_mb"):
            ratio = mine["peak_rss_mb"] / theirs["peak_rss_mb"]
            lines.append(_line(f"{_chats(chats)}: our peak RSS {mine['peak_rss_mb']:.0f} MiB = {ratio:.2f}x "
                               f"{server}'s {theirs['peak_rss_mb']:.0f} (need <= {MEMORY_RATIO_LIMIT:g}x)",
                               ratio <= MEMORY_RATIO_LIMIT))
    return lines


def _chats(count: int) -> str:
    return f"{count} chat" if count == 1 else f"{count} chats"


def _line(text: str, ok: bool) -> str:
    return f"{'PASS' if ok else 'FAIL'}  {text}"


def progress(text: str) -> None:
    """A line on stderr, so stdout holds only the results."""
    print(text, file=sys.stderr, flush=True)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL, help="MODEL: a .gguf file, folder or hub id")
    parser.add_argument("--modes", nargs="*", choices=list(MODES), default=["local", "local-nocache", "raw"],
                        help="our own contenders (none: only the --openai ones)")
    parser.add_argument("--openai", action="append", default=[], metavar="URL",
                        help="a chat-completions server's base URL, e.g. http://127.0.0.1:8771/v1 (repeatable)")
    parser.add_argument("--openai-label", action="append", default=[], help="its name in the table (in order)")
    parser.add_argument("--openai-pid", action="append", type=int, default=[],
                        help="its process id, for its peak memory (in order; 0: unknown)")
    parser.add_argument("--openai-model", default="smol", help="the model name sent to the servers")
    parser.add_argument("--ban-token-ids", type=int, nargs="*", default=None,
                        help="token ids the servers must not generate (default: the GGUF's end tokens)")
    parser.add_argument("--chats", type=int, nargs="+", default=[1, 8], help="concurrent chats per row")
    parser.add_argument("--turns", type=int, default=2, help="questions each chat asks, one after another")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated by every model call of a turn")
    parser.add_argument("--repeat", type=int, default=2, help="rows per contender and concurrency")
    parser.add_argument("--probe-tokens", type=int, default=256,
                        help="tokens the other chats generate during the first-token probe (0: no probe)")
    parser.add_argument("--probe-gap", type=float, default=1.0, help="seconds between first-token probes")
    parser.add_argument("--probes", type=int, default=5, help="at most this many probes per row")
    parser.add_argument("--batch-size", type=int, default=8, help="BATCH_SIZE of the model thread")
    parser.add_argument("--batch-wait-ms", type=int, default=20, help="BATCH_WAIT_MS of the model thread")
    parser.add_argument("--prefix-cache-mb", type=int, default=None,
                        help="PREFIX_CACHE_MB of the cached mode (default: auto, sized from the model)")
    parser.add_argument("--speculative-tokens", type=int, default=5, help="SPECULATIVE_TOKENS of our modes (0: none)")
    parser.add_argument("--speculative-step-tokens", type=int, default=8, help="SPECULATIVE_STEP_TOKENS of our modes")
    parser.add_argument("--dtype", default="auto", help="MODEL_DTYPE (auto: bf16 where the hardware has it)")
    parser.add_argument("--device-map", default="cpu", help="MODEL_DEVICE_MAP (cuda or auto on a GPU machine)")
    parser.add_argument("--converted-dir", type=Path, default=ROOT / ".cache" / "converted-models",
                        help="MODEL_CONVERTED_DIR of the measured contenders")
    parser.add_argument("--no-startup", action="store_true", help="skip the two start-up measurements")
    parser.add_argument("--json", action="store_true", help="print one JSON object per row instead of the table")
    parser.add_argument("--save-json", type=Path, help="also write the JSON rows to this file")
    args = parser.parse_args(argv)
    if not args.modes and not args.openai:
        parser.error("nothing to measure: give --modes or --openai")
    if min(args.chats) < 1 or args.turns < 1 or args.new_tokens < 1 or args.repeat < 1 or args.probe_tokens < 0:
        parser.error("--chats, --turns, --new-tokens and --repeat must be 1 or more, --probe-tokens 0 or more")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the table and the verdicts (or JSON rows); progress goes to stderr."""
    args = parse(argv)
    for quiet in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS"):  # the contenders' loading bars, on stderr
        os.environ.setdefault(quiet, "1")
    started = time.perf_counter()
    rows, facts = bench(args)
    lines = [json.dumps(row, ensure_ascii=False) for row in rows]
    if args.save_json:
        args.save_json.write_text("\n".join(lines) + "\n")
    if args.json:
        progress(json.dumps(facts, ensure_ascii=False))
        print(*lines, sep="\n")
        return 0
    print(f"{facts['cpu']}, {facts['nproc']} CPUs, load average {facts['load_before']} before, "
          f"{facts['load_after']} after; model {Path(args.model).name}, dtype {args.dtype}, {args.new_tokens} new "
          f"tokens per call, {args.turns} turns per chat, {args.repeat} repeats (medians), batch size "
          f"{args.batch_size}, probe {args.probe_tokens} tokens; {time.perf_counter() - started:.0f} s in all\n")
    print(table(rows))
    print("", *verdicts(rows, args.chats), sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
