"""The local benchmark's openai contender, end to end against the fake OpenAI server (no model is loaded).

bench/bench_local.py runs the agent's real ReAct turns through our openai backend in a process of its own; this
checks what the server receives (distinct questions, fixed lengths: `max_tokens` and the banned end tokens, no stop
strings) and the JSON rows it prints. The fake counts characters as tokens, so 4-character replies are 4 tokens.
"""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from bench import bench_local
from tests.fakes.openai_server import FakeOpenAIServer

NEW_TOKENS = 4
ROW_KEYS = {"mode", "chats", "tokens", "seconds", "tokens_per_s", "turn_p50_s", "turn_p95_s", "first_token_p50_s",
            "prompt_tokens_computed", "prompt_tokens_reused", "peak_rss_mb"}


def test_openai_contender_rows_and_requests(capsys):
    chats, turns, repeats = (1, 2), 2, 2
    warm_up_calls = max(chats) * 1 * 2
    calls = warm_up_calls + sum(chats) * turns * 2 * repeats
    with FakeOpenAIServer(model="smol") as server:
        server.add(*["abcd"] * calls)
        code = bench_local.main(["--modes", "--openai", server.base_url, "--openai-label", "fake server",
                                 "--chats", *map(str, chats), "--turns", str(turns), "--repeat", str(repeats),
                                 "--new-tokens", str(NEW_TOKENS), "--probe-tokens", "0", "--no-startup",
                                 "--ban-token-ids", "0", "2", "--json"])
        requests = server.chat_requests
    assert code == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(row["mode"], row["chats"], row["repeat"]) for row in rows] == [
        ("fake server", c, r) for r in (1, 2) for c in chats]
    for row in rows:
        assert ROW_KEYS <= row.keys()
        assert row["tokens"] == row["chats"] * turns * 2 * NEW_TOKENS
        assert row["short_calls"] == 0
        assert row["turns"] == row["chats"] * turns
        assert row["turn_p50_s"] > 0 and row["turn_p95_s"] >= row["turn_p50_s"]
        assert row["tokens_per_s"] == row["tokens"] / row["seconds"]
        # The fake says nothing of reused prompt tokens: unknown, not zero.
        assert row["prompt_tokens_reused"] is None and row["prompt_tokens_computed"] is None
        assert row["prompt_tokens_sent"] > 0
    assert len(requests) == calls
    for request in requests:
        assert request.body["max_tokens"] == NEW_TOKENS
        assert request.body["logit_bias"] == {"0": -100, "2": -100}
        assert "stop" not in request.body  # fixed lengths: nothing may end a call early
    # A first call's prompt ends with its question; the second call's goes on with the folded trace.
    contents = [r.body["messages"][-1]["content"] for r in requests]
    first_calls = [re.findall(r"^Question: (.*)$", c, re.MULTILINE)[-1] for c in contents
                   if re.search(r"(^|\n)Question: [^\n]*$", c)]
    assert len(first_calls) == calls // 2 and len(set(first_calls)) == len(first_calls)  # every question distinct


def test_end_tokens_of_the_test_gguf_are_the_ones_llama_cpp_ends_on():
    # SmolLM2's eos is <|im_end|> (2); <|endoftext|> (0) ends a llama.cpp generation too, by its name.
    assert bench_local.end_token_ids(bench_local.DEFAULT_MODEL) == (0, 2)


def test_a_start_is_timed_to_the_line_that_says_the_model_is_loaded():
    """The second-start row times a real `qwenbot ask` to its "loaded" log line, and stops the process there."""
    says_loaded = ["import sys, time; sys.stderr.write('x INFO agent.llm.engine.loading: loaded m in 0.1 s\\n'); "
                   "sys.stderr.flush(); time.sleep(60)"]
    seconds = bench_local._seconds_to_line([sys.executable, "-c", *says_loaded], dict(os.environ),
                                           bench_local.LOADED_LINE)
    assert seconds > 0  # it returned at the line: the process would otherwise sleep on for a minute


def test_a_start_that_never_loads_the_model_stops_the_bench_with_its_exit_code_and_last_line():
    command = [sys.executable, "-c", "import sys; sys.stderr.write('MODEL: no such file\\n'); sys.exit(3)"]
    with pytest.raises(SystemExit, match=r"exited \(code 3\) before logging .*: MODEL: no such file$"):
        bench_local._seconds_to_line(command, dict(os.environ), bench_local.LOADED_LINE)


def _measured(mode: str, chats: int, repeat: int, tokens_per_s: float, p50: float, p95: float, rss: float) -> dict:
    return {"mode": mode, "chats": chats, "repeat": repeat, "tokens_per_s": tokens_per_s, "turn_p50_s": p50,
            "turn_p95_s": p95, "peak_rss_mb": rss}


def test_the_verdicts_hold_memory_to_1_2_times_the_servers_and_the_second_start_to_3_seconds():
    """Issue 37's lines, from the medians of the repeats: peak RSS within 1.2x the server's at each level, and
    `qwenbot ask` ready within 3 s on its second start."""
    rows = [_measured("local", 1, 1, 30, 2.0, 2.0, 1300), _measured("local", 1, 2, 30, 2.0, 2.0, 1100),
            _measured("llama-server", 1, 1, 20, 3.0, 3.0, 1000), _measured("llama-server", 1, 2, 20, 3.0, 3.0, 1000),
            _measured("local", 8, 1, 60, 7.0, 9.0, 1150), _measured("local", 8, 2, 60, 7.0, 9.0, 1150),
            _measured("llama-server", 8, 1, 25, 15.0, 25.0, 1000), _measured("llama-server", 8, 2, 25, 15, 25, 1000),
            {"mode": "local start: converted copy", "chats": 0, "seconds": 2.5, "ready_s": 4.0},
            {"mode": bench_local.ASK_START, "chats": 0, "seconds": 3.4}]
    lines = bench_local.verdicts(rows, (1, 8))
    memory = [line for line in lines if "peak RSS" in line]
    assert memory == ["PASS  1 chat: our peak RSS 1200 MiB = 1.20x llama-server's 1000 (need <= 1.2x)",
                      "PASS  8 chats: our peak RSS 1150 MiB = 1.15x llama-server's 1000 (need <= 1.2x)"]
    start = [line for line in lines if "second start" in line]
    assert len(start) == 1 and start[0].startswith("FAIL") and start[0].endswith("(need <= 3 s)")
    rows[-1]["seconds"] = 2.9
    assert bench_local.verdicts(rows, (1, 8))[-1].startswith("PASS  second start")
    rows[4]["peak_rss_mb"] = rows[5]["peak_rss_mb"] = 1250
    assert "FAIL  8 chats: our peak RSS 1250 MiB = 1.25x llama-server's 1000 (need <= 1.2x)" in \
        bench_local.verdicts(rows, (1, 8))
