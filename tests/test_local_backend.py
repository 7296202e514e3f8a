"""The local backend on a real model: SmolLM2-135M-Instruct (GGUF, ChatML) loaded through the real loading code.

The model is loaded once for the module (about 20 s on two cores); every test then drives `LocalLLM` the way the
agent does, from the event loop. Nothing about the model is mocked: failures inside `generate` are provoked through
the one hook a caller really has into a running generation, its cancel token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_asyncio

from agent.errors import LLMCancelled, LLMError, LLMOutOfMemory, ModelLoadError
from agent.llm.base import CancelToken, Completion, ModelRequest
from agent.llm.engine.batch import APART_PASS_TOKENS, lay_out, rows_to_prefill_apart, shared_prefix_length
from agent.llm.engine.loading import cpu_has_native_bf16
from agent.llm.local import LocalLLM
from tests.real_model import GGUF, real_model_test, started_local_llm, worker_log_watched

REPO = Path(__file__).resolve().parents[1]

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
HAIKU = [{"role": "user", "content": "Write a haiku about the sea."}]
FRUITS = [{"role": "user", "content": "List three fruits."}]
SKY = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def llm():
    """The offline model behind `LocalLLM`, started once for the whole module."""
    backend = await started_local_llm()
    yield backend
    await backend.close()


async def run_as_one_batch(llm: LocalLLM, *calls: dict) -> list:
    """Run `calls` (keyword arguments of `complete`) so that they share one batch.

    A short request keeps the model thread busy first; everything submitted meanwhile waits in the queue and is
    taken together as the next batch.
    """
    busy = asyncio.create_task(llm.complete(ModelRequest(SKY, max_new_tokens=6)))
    await asyncio.sleep(0.05)
    results = await asyncio.gather(*(llm.complete(ModelRequest(**call)) for call in calls), return_exceptions=True)
    await busy
    return results


@contextlib.asynccontextmanager
async def batch_started(size: int):
    """An event set when the model thread starts generating a batch of `size` (it logs that, from its thread)."""
    loop, started = asyncio.get_running_loop(), asyncio.Event()

    def note(message: str) -> None:
        if f"generating a batch of {size} " in message:
            loop.call_soon_threadsafe(started.set)

    with worker_log_watched(note):
        yield started


class CountingToken(CancelToken):
    """A cancel token that is never set and counts how often generation asked it (once per step of its row)."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    @property
    def cancelled(self) -> bool:
        self.looks += 1
        return False


async def wait_until(predicate, timeout: float = 60.0) -> None:
    """Poll `predicate` on the event loop until it holds (a generous timeout: a busy machine is slow)."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


class ExplodingToken(CancelToken):
    """A cancel token that raises `error` once generation asks it whether to stop (the first look is before)."""

    def __init__(self, error: BaseException):
        super().__init__()
        self.error, self.looks = error, 0

    @property
    def cancelled(self) -> bool:
        self.looks += 1
        if self.looks > 1:
            raise self.error
        return False


@real_model_test
async def test_chat_template_opens_a_new_assistant_turn(llm: LocalLLM) -> None:
    reply = await llm.complete(ModelRequest(FRANCE, max_new_tokens=12))
    assert reply.text.startswith("The capital of France is Paris")
    assert reply.prompt_tokens > llm.count_tokens(FRANCE[0]["content"])  # the template wrapped the question


@real_model_test
async def test_a_final_assistant_message_is_continued_not_restarted(llm: LocalLLM) -> None:
    prefix = {"role": "assistant", "content": "The capital of France is"}
    reply = await llm.complete(ModelRequest([*FRANCE, prefix], max_new_tokens=6))
    assert reply.text.startswith(" Paris")


@real_model_test
async def test_generation_ends_at_a_stop_string_which_is_trimmed(llm: LocalLLM) -> None:
    free = await llm.complete(ModelRequest(HAIKU, max_new_tokens=24))
    assert "\n" in free.text and free.finish_reason == "length"

    stopped = await llm.complete(ModelRequest(HAIKU, max_new_tokens=24, stop=["\n"]))
    assert stopped.text == free.text.split("\n")[0]
    assert stopped.finish_reason == "stop"
    assert stopped.completion_tokens < free.completion_tokens


@real_model_test
async def test_batched_greedy_outputs_equal_the_same_requests_alone(llm: LocalLLM, caplog) -> None:
    calls = [
        dict(messages=FRANCE, max_new_tokens=16, stop=["Paris"]),
        dict(messages=HAIKU, max_new_tokens=20, stop=["\n"]),
        dict(messages=FRUITS, max_new_tokens=12),
        dict(messages=SKY, max_new_tokens=24, stop=["Observation:"]),
    ]
    alone = [await llm.complete(ModelRequest(**call)) for call in calls]
    with caplog.at_level(logging.DEBUG, logger="agent.llm.engine.model_thread"):
        together = await run_as_one_batch(llm, *calls)
    assert "generating a batch of 4" in caplog.text
    assert together == alone
    assert alone[0].text == "The capital of France is " and alone[0].finish_reason == "stop"


@real_model_test
async def test_rows_sharing_a_long_prompt_prefix_still_equal_their_runs_alone(llm: LocalLLM, caplog) -> None:
    # Like ReAct prompts: one long shared instruction (computed once for the batch), different questions.
    rules = "You answer questions about courses. " + " ".join(f"Rule {n}: be brief and exact." for n in range(1, 11))
    calls = [dict(messages=[{"role": "system", "content": rules}, *question], max_new_tokens=8, stop=["\n"])
             for question in (FRANCE, HAIKU, FRUITS, SKY)]
    alone = [await llm.complete(ModelRequest(**call)) for call in calls]
    with caplog.at_level(logging.DEBUG, logger="agent.llm.engine.batch"):
        together = await run_as_one_batch(llm, *calls)
    shared = re.search(r"batch of 4: reused \((\d+), (\d+), (\d+), (\d+)\) prompt tokens", caplog.text)
    assert shared and all(int(reused) > 80 for reused in shared.groups())  # the shared prefix, computed once
    assert [(c.text, c.finish_reason, c.completion_tokens) for c in together] == \
        [(c.text, c.finish_reason, c.completion_tokens) for c in alone]


@real_model_test
async def test_requests_arriving_a_few_ms_apart_share_one_batch(llm: LocalLLM, caplog) -> None:
    async def later(call):
        await asyncio.sleep(0.005)
        return await call

    with caplog.at_level(logging.DEBUG, logger="agent.llm.engine.model_thread"):
        await asyncio.gather(llm.complete(ModelRequest(FRANCE, max_new_tokens=2)),
                             later(llm.complete(ModelRequest(HAIKU, max_new_tokens=2))))
    assert "generating a batch of 2" in caplog.text


@real_model_test
async def test_each_row_of_a_batch_streams_its_own_text_as_it_is_generated(llm: LocalLLM) -> None:
    calls = [dict(messages=FRANCE, max_new_tokens=16, stop=["Paris"]), dict(messages=HAIKU, max_new_tokens=20),
             dict(messages=FRUITS, max_new_tokens=12)]
    alone = [await llm.complete(ModelRequest(**call)) for call in calls]
    pieces: list[list[str]] = [[] for _ in calls]
    before_answer: dict[int, int] = {}  # by row: rows end at different steps, each answered when its own ends

    async def streamed(index: int, call: dict) -> Completion:
        completion = await llm.complete(ModelRequest(**call, on_text=pieces[index].append))
        before_answer[index] = len(pieces[index])  # pieces that arrived before the call returned
        return completion

    together = await asyncio.gather(*(streamed(i, call) for i, call in enumerate(calls)))

    assert together == alone  # streaming changes nothing about the results
    for completion, row_pieces in zip(together, pieces):
        assert len(row_pieces) > 3  # piece by piece, not at the end in one go
        # What streamed is the row's own text; it may run past the stop string ("Paris" here), never fall short.
        assert "".join(row_pieces).startswith(completion.text)
    assert "Paris" in "".join(pieces[0]) and alone[0].text == "The capital of France is "
    assert [before_answer[index] for index in range(len(calls))] == [len(row) for row in pieces]  # none after it


@real_model_test
async def test_cancelling_one_row_leaves_the_others_untouched(llm: LocalLLM) -> None:
    others = [dict(messages=HAIKU, max_new_tokens=16), dict(messages=FRUITS, max_new_tokens=16)]
    alone = [await llm.complete(ModelRequest(**call)) for call in others]
    token = CancelToken()

    async def cancel_mid_batch() -> None:
        async with batch_started(size=3) as started:
            await started.wait()
            await asyncio.sleep(0.2)  # a few generation steps in
            token.cancel()

    canceller = asyncio.create_task(cancel_mid_batch())
    cancelled, *rest = await run_as_one_batch(llm, dict(messages=SKY, max_new_tokens=400, cancel=token), *others)
    await canceller
    assert isinstance(cancelled, LLMCancelled) and "during generation" in str(cancelled)
    assert rest == alone


@real_model_test
async def test_cancelling_the_awaiting_task_frees_the_model_thread(llm: LocalLLM) -> None:
    # Never set itself, this token is asked at each step of the long row, for as long as the row's own token
    # (set when its awaiting task is cancelled) does not stop it first.
    steps = CountingToken()
    long_call = asyncio.create_task(llm.complete(ModelRequest(SKY, max_new_tokens=1000, cancel=steps)))
    await wait_until(lambda: steps.looks > 3)  # generating
    long_call.cancel()
    reply = await llm.complete(ModelRequest(FRANCE, max_new_tokens=4))
    assert reply.text.startswith("The capital")
    with pytest.raises(asyncio.CancelledError):
        await long_call
    # Left running, the abandoned row would have held the thread for its 1000 steps before the next request ran.
    assert steps.looks < 1000
    looked = steps.looks
    await llm.complete(ModelRequest(FRANCE, max_new_tokens=2))
    assert steps.looks == looked  # and it is gone: nothing asks about it any more


@real_model_test
async def test_the_event_loop_keeps_ticking_while_the_model_generates(llm: LocalLLM) -> None:
    steps = CountingToken()
    seen: list[int] = []  # the long row's step count, as each tick of the loop saw it
    generating = asyncio.gather(llm.complete(ModelRequest(SKY, max_new_tokens=48, cancel=steps)),
                                *(llm.complete(ModelRequest(m, max_new_tokens=16)) for m in (FRANCE, HAIKU, FRUITS)))
    while not generating.done():
        seen.append(steps.looks)
        await asyncio.sleep(0.001)
    replies = await generating
    assert all(isinstance(reply, Completion) and reply.text for reply in replies)
    # A loop blocked by the model would see the batch before it starts and after it ends, nothing between: here
    # it ticked between the model's steps, seeing the count grow step by step.
    during = {count for count in seen if 0 < count < steps.looks}
    assert len(during) >= 5, f"the loop saw only {sorted(during)} of {steps.looks} steps"


@real_model_test
async def test_an_error_inside_generate_reaches_its_callers_and_the_next_request_works(llm: LocalLLM) -> None:
    failing = dict(messages=FRANCE, max_new_tokens=8, cancel=ExplodingToken(RuntimeError("boom")))
    bystander = dict(messages=HAIKU, max_new_tokens=8)
    results = await run_as_one_batch(llm, failing, bystander)
    assert [type(r) for r in results] == [LLMError, LLMError]
    assert "boom" in str(results[0])

    after = await llm.complete(ModelRequest(FRANCE, max_new_tokens=8))
    assert after.text.startswith("The capital of France")


@real_model_test
async def test_out_of_memory_becomes_llm_out_of_memory_for_the_whole_batch(llm: LocalLLM) -> None:
    import torch

    failing = dict(messages=FRANCE, max_new_tokens=8, cancel=ExplodingToken(torch.OutOfMemoryError("fake OOM")))
    results = await run_as_one_batch(llm, failing, dict(messages=HAIKU, max_new_tokens=8))
    assert all(isinstance(r, LLMOutOfMemory) and "BATCH_SIZE" in str(r) for r in results)
    assert (await llm.complete(ModelRequest(FRUITS, max_new_tokens=4))).text


@real_model_test
async def test_a_tokenizer_without_chat_template_is_refused_at_start(llm: LocalLLM, tmp_path: Path) -> None:
    import copy

    tokenizer = copy.deepcopy(llm._counter)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="no chat template"):
        await LocalLLM(str(tmp_path), device_map="cpu").start()


@pytest.mark.parametrize("path, message", [
    ("./nope.gguf", "MODEL ./nope.gguf: no such file"),
    ("./nope", "MODEL ./nope: no such file or folder"),
])
async def test_a_bad_model_path_fails_start_with_one_clear_line(path: str, message: str) -> None:
    with pytest.raises(ModelLoadError) as raised:
        await LocalLLM(path).start()
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


async def test_a_folder_without_a_model_fails_start_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as raised:
        await LocalLLM(str(tmp_path), device_map="cpu").start()
    assert str(raised.value).startswith(f"MODEL {tmp_path}: cannot load it")
    assert "\n" not in str(raised.value)



@real_model_test
async def test_close_cancels_what_is_in_flight_and_refuses_new_requests() -> None:
    backend = LocalLLM(str(GGUF), device_map="cpu", batch_size=1)
    await backend.start()
    running = asyncio.create_task(backend.complete(ModelRequest(SKY, max_new_tokens=1000)))
    queued = asyncio.create_task(backend.complete(ModelRequest(FRANCE, max_new_tokens=1000)))
    await asyncio.sleep(0.3)
    await asyncio.wait_for(backend.close(), timeout=10)
    results = await asyncio.gather(running, queued, return_exceptions=True)
    assert isinstance(results[0], LLMCancelled)
    assert type(results[1]) is LLMError and "shutting down" in str(results[1])
    with pytest.raises(LLMError, match="not running"):
        await backend.complete(ModelRequest(FRANCE, max_new_tokens=4))


def test_reused_prefixes_come_first_then_padding_then_each_rows_own_tokens() -> None:
    shared = list(range(100, 140))
    layout = lay_out([shared + [7], shared[:30] + [8, 9, 10]], reused=[40, 30], pad_id=0, device="cpu")
    assert layout.cached == 40
    assert layout.input_ids.tolist() == [shared + [0, 0, 7], shared[:30] + [0] * 10 + [8, 9, 10]]
    assert layout.attention_mask.tolist() == [[1] * 40 + [0, 0, 1], [1] * 30 + [0] * 10 + [1, 1, 1]]
    assert layout.own_columns(1, 33).tolist() == list(range(30)) + [40, 41, 42]


def test_rows_with_nothing_reused_are_plainly_left_padded() -> None:
    layout = lay_out([[1, 2, 3], [1, 2, 4, 5]], reused=[0, 0], pad_id=0, device="cpu")
    assert layout.cached == 0
    assert layout.input_ids.tolist() == [[0, 1, 2, 3], [1, 2, 4, 5]]
    assert layout.attention_mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    assert shared_prefix_length([list(range(100))]) == 0  # one row shares nothing with itself


def test_a_newcomer_beside_resumed_rows_is_prefilled_apart_so_the_batch_computes_one_column_per_row() -> None:
    # 7 resumed rows need one column each; the newcomer's 200 tokens would otherwise be computed 8 times.
    assert rows_to_prefill_apart([1] * 7 + [200]) == {7}


def test_rows_of_very_different_lengths_are_split_where_the_fewest_columns_are_computed() -> None:
    # Two long observations and six short ones: the long two apart, the short six together at width 20.
    own = [300, 20, 20, 280, 20, 20, 20, 20]
    assert rows_to_prefill_apart(own) == {0, 3}
    apart = (300 - 1 + APART_PASS_TOKENS) + (280 - 1 + APART_PASS_TOKENS) + len(own) * 20
    assert apart < len(own) * 300  # what the batch would have computed with all of them together


def test_rows_of_about_the_same_length_stay_in_one_batch() -> None:
    assert rows_to_prefill_apart([40, 38, 41, 39]) == set()
    assert rows_to_prefill_apart([1, 1, 1]) == set()  # resumed rows: one column each already
    assert rows_to_prefill_apart([]) == set()


def qwenbot_ask(tmp_path: Path, model: str, question: str, mode: str = "react") -> subprocess.CompletedProcess:
    """`qwenbot ask` as a user runs it, on the local backend, configured only through the environment."""
    settings = {"LLM_BACKEND": "local", "MODEL": model, "MODEL_DEVICE_MAP": "cpu", "AGENT_MODE": mode,
                "DATA_DIR": str(tmp_path), "DATABASE_PATH": str(tmp_path / "bot.sqlite3"), "MAX_NEW_TOKENS": "24",
                "MAX_STEPS": "2",
                "LOG_LEVEL": "WARNING"}
    environ = {**os.environ, **settings, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "bot.program.cli", "ask", question], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.real_model
def test_qwenbot_ask_completes_and_stores_a_turn_on_the_local_model(tmp_path: Path) -> None:
    done = qwenbot_ask(tmp_path, str(GGUF), "请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # the tiny model cannot do ReAct; whatever it answers, the turn completes
    with sqlite3.connect(tmp_path / "bot.sqlite3") as db:
        (answer, status, model_calls), = db.execute("SELECT answer, status, model_calls FROM turns").fetchall()
    assert answer == done.stdout.strip()
    assert status in ("answered", "step_limit", "gave_up") and model_calls >= 1


def test_qwenbot_ask_with_a_missing_model_fails_in_one_line(tmp_path: Path) -> None:
    done = qwenbot_ask(tmp_path, "./nope.gguf", "hello")
    assert done.returncode == 2
    # A relative MODEL is looked for in the data directory, and the line says where that was.
    expected = f"qwenbot: MODEL ./nope.gguf: no such file ({tmp_path / 'nope.gguf'})"
    assert done.stderr.strip().splitlines()[-1] == expected
    assert "Traceback" not in done.stderr


@pytest.mark.real_model
def test_native_mode_on_a_template_that_ignores_tools_stops_at_start_in_one_line(tmp_path: Path) -> None:
    done = qwenbot_ask(tmp_path, str(GGUF), "hello", mode="native")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"qwenbot: MODEL {GGUF}: its chat template ignores tools, so AGENT_MODE=native would show the model none; "
        "use AGENT_MODE=react")
    assert "Traceback" not in done.stderr


@real_model_test
@pytest.mark.parametrize("dtype", ["int8", "int4"])
async def test_quantized_weights_load_and_still_answer(caplog, dtype: str) -> None:
    backend = LocalLLM(str(GGUF), device_map="cpu", dtype=dtype, batch_size=8)
    with caplog.at_level(logging.INFO, logger="agent.llm"):
        await backend.start()
    try:
        reply = await backend.complete(ModelRequest(FRANCE, max_new_tokens=12))
    finally:
        await backend.close()
    assert f"({dtype} on cpu)" in caplog.text
    assert (f"{dtype} weights; embedding, norms, attention and KV cache in bf16" in caplog.text) == cpu_has_native_bf16()
    assert "Paris" in reply.text and reply.completion_tokens <= 12
