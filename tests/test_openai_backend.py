"""The OpenAI-compatible backend against a real HTTP server on 127.0.0.1 (tests/fakes/openai_server.py).

Each test asserts on what the server received and what the caller got back.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.errors import LLMCancelled, LLMError, LLMTimeout
from bot.program.services import build_llm
from agent.llm.base import CancelToken, ModelRequest, ToolCall
from agent.grammar import Grammar
from agent.llm.openai import OpenAILLM
from agent.llm.openai_stream import StreamLimits
from bot.program.config import Settings
from tests.fakes.openai_server import DROP, HANG, FakeOpenAIServer, error, text, tool_call

REPO = Path(__file__).resolve().parents[1]
REACT_STOP = ["Observation:"]
COURSE_TOOL = {
    "type": "function",
    "function": {
        "name": "course_lookup",
        "description": "Look up a course by name.",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
}


@pytest.fixture
def server():
    with FakeOpenAIServer() as fake:
        yield fake


def make_llm(server: FakeOpenAIServer, **overrides) -> OpenAILLM:
    options = {"base_url": server.base_url, "model": "fake-qwen", "limits": limits(), "max_retries": 3}
    return OpenAILLM(**{**options, **overrides})


def limits(first_token: float = 10.0, silence: float = 10.0, connect: float = 5.0) -> StreamLimits:
    return StreamLimits(connect_seconds=connect, first_token_seconds=first_token, silence_seconds=silence)


@pytest.fixture
async def llm(server):
    backend = make_llm(server)
    yield backend
    await backend.close()


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def user(content: str) -> dict:
    return {"role": "user", "content": content}


async def test_react_continuation_folds_the_assistant_prefix_into_the_user_message(server, llm):
    trace = ('Thought: 我应该查课程。\nAction: course_lookup\nAction Input: {"name": "大模型技术实战"}\n'
             'Observation: {"课时": 200}\nThought:')
    server.add(" I now know the final answer\nFinal Answer: 200")
    messages = [{"role": "system", "content": "You are helpful."}, user("Question: 多少节？"),
                {"role": "assistant", "content": trace}]

    completion = await llm.complete(ModelRequest(messages, stop=REACT_STOP, max_new_tokens=64))

    assert completion.text == " I now know the final answer\nFinal Answer: 200"
    sent = server.chat_requests[0].body
    assert sent["messages"] == [{"role": "system", "content": "You are helpful."},
                                {"role": "user", "content": "Question: 多少节？\n" + trace}]
    assert sent["stop"] == REACT_STOP
    assert sent["max_tokens"] == 64
    assert sent["model"] == "fake-qwen"


async def test_generation_ends_at_the_stop_string_which_is_not_returned(server, llm):
    server.add("Thought: look it up\nAction: course_lookup\nAction Input: {}\nObservation: invented result")

    completion = await llm.complete(ModelRequest([user("Question: ?")], stop=REACT_STOP))

    assert completion.text == "Thought: look it up\nAction: course_lookup\nAction Input: {}\n"
    assert completion.finish_reason == "stop"
    assert completion.completion_tokens == len(completion.text)  # the server's usage is passed through


async def test_hitting_the_token_limit_is_reported_as_length(server, llm):
    server.add(text("Thought: a long", finish_reason="length"))

    completion = await llm.complete(ModelRequest([user("Question: ?")], stop=REACT_STOP, max_new_tokens=4))

    assert completion.finish_reason == "length"
    assert server.chat_requests[0].body["max_tokens"] == 4


async def test_two_server_errors_then_an_answer_gives_the_answer_after_growing_backoff(server, llm):
    server.add(error(500), error(502), "Final Answer: 200")

    completion = await llm.complete(ModelRequest([user("Question: ?")]))

    assert completion.text == "Final Answer: 200"
    arrivals = [request.received_at for request in server.chat_requests]
    assert len(arrivals) == 3
    first_wait, second_wait = arrivals[1] - arrivals[0], arrivals[2] - arrivals[1]
    assert 0.3 < first_wait < second_wait  # exponential backoff: the second wait is the longer


async def test_rate_limit_waits_as_long_as_retry_after_says(server, llm):
    server.add(error(429, "slow down", retry_after=1), "Final Answer: 200")

    completion = await llm.complete(ModelRequest([user("Question: ?")]))

    assert completion.text == "Final Answer: 200"
    first, second = server.chat_requests
    assert second.received_at - first.received_at >= 0.95  # the client's own first backoff would be ≤ 0.5 s


async def test_a_dropped_connection_is_retried(server, llm):
    server.add(DROP, "Final Answer: 200")

    completion = await llm.complete(ModelRequest([user("Question: ?")]))

    assert completion.text == "Final Answer: 200"
    assert len(server.chat_requests) == 2


async def test_a_server_that_never_answers_times_out_with_a_clear_message(server):
    llm = make_llm(server, limits=limits(first_token=0.5), max_retries=3)
    server.add(HANG, HANG, HANG, HANG)

    with pytest.raises(LLMTimeout) as raised:
        await llm.complete(ModelRequest([user("Question: ?")]))

    assert len(server.chat_requests) == 1  # one limit for the first token, not one per retry
    assert str(raised.value) == (f"model server at {server.base_url} sent no answer within 0.5 s "
                                 "(OPENAI_FIRST_TOKEN_SECONDS)")
    await llm.close()


async def test_a_client_error_becomes_one_line_with_status_and_message_and_no_api_key(server):
    llm = make_llm(server, api_key="sk-very-secret-key")
    server.add(error(400, "Incorrect API key provided: sk-very-secret-key.\nSee the docs."))

    with pytest.raises(LLMError) as raised:
        await llm.complete(ModelRequest([user("Question: ?")]))

    message = str(raised.value)
    assert message == f"model server at {server.base_url} answered 400: Incorrect API key provided: ***. See the docs."
    assert len(server.chat_requests) == 1  # a 400 is not retried
    assert server.chat_requests[0].headers["authorization"] == "Bearer sk-very-secret-key"
    await llm.close()


async def test_native_mode_passes_tools_and_returns_the_parsed_tool_calls(server, llm):
    server.add(tool_call("course_lookup", {"name": "大模型技术实战"}, call_id="call_abc"))

    completion = await llm.complete(ModelRequest([user("多少节？")], tools=[COURSE_TOOL]))

    assert server.chat_requests[0].body["tools"] == [COURSE_TOOL]
    assert completion.tool_calls == (
        ToolCall(name="course_lookup", arguments='{"name": "大模型技术实战"}', id="call_abc"),
    )


async def test_native_history_is_sent_with_json_arguments_and_matching_ids(server, llm):
    server.add("大模型技术实战一共 200 节。")
    messages = [
        user("多少节？"),
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "course_lookup", "arguments": {"name": "大模型"}}},
        ]},
        {"role": "tool", "name": "course_lookup", "content": {"课时": 200}},
    ]

    completion = await llm.complete(ModelRequest(messages, tools=[COURSE_TOOL]))

    assert completion.text == "大模型技术实战一共 200 节。"
    assistant, tool = server.chat_requests[0].body["messages"][1:]
    call = assistant["tool_calls"][0]
    assert call["function"] == {"name": "course_lookup", "arguments": '{"name": "大模型"}'}
    assert call["id"] and tool["tool_call_id"] == call["id"]
    assert json.loads(tool["content"]) == {"课时": 200}


async def test_many_requests_are_in_flight_at_once(server, llm):
    server.add(*[text("Final Answer: ok", delay=0.3) for _ in range(8)])

    completions = await asyncio.gather(*[llm.complete(ModelRequest([user(f"Question {n}")])) for n in range(8)])

    assert [c.text for c in completions] == ["Final Answer: ok"] * 8
    assert server.max_in_flight == 8  # the server held all eight at the same time


async def test_cancelling_a_waiting_request_raises_cancelled_promptly(server, llm):
    server.add(HANG)
    cancel = CancelToken()
    asyncio.get_running_loop().call_later(0.2, cancel.cancel)

    with pytest.raises(LLMCancelled):  # the server never answers: only the cancel can end the call
        await llm.complete(ModelRequest([user("Question: ?")], cancel=cancel))

    assert len(server.chat_requests) == 1


# --- streaming ------------------------------------------------------------------------------------------------

async def test_the_answer_arrives_piece_by_piece_while_the_server_is_still_generating(server, llm):
    answer = "Thought: I now know the final answer\nFinal Answer: 大模型技术实战课程一共200节。"
    server.add(text(answer, pieces=6, chunk_delay=0.2))
    received: list[tuple[float, str]] = []

    completion = await llm.complete(ModelRequest([user("Question: ?")], stop=REACT_STOP,
                                    on_text=lambda piece: received.append((time.monotonic(), piece))))

    assert completion.text == answer
    assert "".join(piece for _, piece in received) == answer and len(received) == 6
    sent = server.streams[0].sent_at
    assert received[0][0] < sent[-1]  # the first piece was in hand before the server sent its last one
    assert server.chat_requests[0].body["stream"] is True


async def test_a_server_that_goes_silent_mid_answer_fails_the_call_in_one_line_and_is_hung_up_on(server):
    llm = make_llm(server, limits=limits(silence=0.5))
    server.add(text("Thought: let me think about this for a long while", pieces=8, silent_after=3))
    received: list[str] = []

    with pytest.raises(LLMTimeout) as raised:
        await llm.complete(ModelRequest([user("Question: ?")], on_text=received.append))

    assert str(raised.value) == (f"model server at {server.base_url} went silent mid-answer for 0.5 s "
                                 "(OPENAI_SILENCE_SECONDS)")
    assert len(received) == 3
    await wait_until(lambda: server.streams[0].closed_by_client)
    await llm.close()


async def test_cancelling_mid_answer_closes_the_connection_so_the_server_stops(server, llm):
    server.add(text("word " * 100, pieces=100, chunk_delay=0.05))
    cancel = CancelToken()
    received: list[str] = []

    def take(piece: str) -> None:
        received.append(piece)
        if len(received) == 3:
            cancel.cancel()

    with pytest.raises(LLMCancelled):
        await llm.complete(ModelRequest([user("Question: ?")], cancel=cancel, on_text=take))

    await wait_until(lambda: server.streams[0].closed_by_client)  # the fake saw the connection close under it
    assert not server.streams[0].finished and len(server.streams[0].sent_at) < 100


async def test_a_turn_that_runs_out_of_time_also_closes_the_stream(server, llm):
    server.add(text("word " * 100, pieces=100, chunk_delay=0.05))

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):  # what the agent's turn limit does to a call in flight
            await llm.complete(ModelRequest([user("Question: ?")], on_text=lambda piece: None))

    await wait_until(lambda: server.streams[0].closed_by_client)


async def test_a_stream_that_ends_without_a_finish_reason_is_an_error_not_a_short_answer(server, llm):
    server.add(text("Thought: half of a", pieces=3, unfinished=True))

    with pytest.raises(LLMError) as raised:
        await llm.complete(ModelRequest([user("Question: ?")]))

    assert str(raised.value).startswith(f"model server at {server.base_url} ended the answer before it was finished")
    assert "--interrupt_requests False" in str(raised.value)  # the fix, for the server that does this


async def wait_until(predicate, timeout: float = 5.0) -> None:
    """Poll `predicate` on the event loop; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.02)


async def test_start_checks_the_model_list(server, llm):
    await llm.start()

    assert [(r.method, r.path) for r in server.requests] == [("GET", "/v1/models")]


async def test_start_against_an_unreachable_server_fails_in_one_clear_line():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    llm = OpenAILLM(base_url=url, model="fake-qwen", startup_seconds=3600)

    with pytest.raises(LLMError) as raised:
        # Nothing listens: no waiting for it, whatever the start-up budget (an hour here, which would hang).
        await asyncio.wait_for(llm.start(), 120)

    message = str(raised.value)
    assert message.startswith(f"cannot reach the model server at {url}: ") and message.endswith("(is it running?)")
    assert "\n" not in message
    await llm.close()


async def test_start_waits_for_a_server_that_refuses_connections_while_it_loads(caplog):
    """vLLM beside the bot in compose listens only once its model is loaded: OPENAI_SERVER_WAIT_SECONDS covers it."""
    port = closed_port()
    llm = OpenAILLM(base_url=f"http://127.0.0.1:{port}/v1", model="fake-qwen", server_wait_seconds=60,
                    limits=limits())
    with caplog.at_level("WARNING", logger="agent.llm.openai"):
        starting = asyncio.create_task(llm.start())
        await asyncio.sleep(1.0)
        assert not starting.done()  # refused, and trying again
        with FakeOpenAIServer(port=port) as late:
            await asyncio.wait_for(starting, 30)
            assert [r.path for r in late.requests] == ["/v1/models"]
    assert (f"the model server at http://127.0.0.1:{port}/v1 refuses connections (still starting?); trying again "
            f"in 5 s, up to") in caplog.text and "(OPENAI_SERVER_WAIT_SECONDS)" in caplog.text
    await llm.close()


async def test_a_server_that_still_refuses_after_the_wait_fails_in_one_clear_line():
    url = f"http://127.0.0.1:{closed_port()}/v1"
    llm = OpenAILLM(base_url=url, model="fake-qwen", server_wait_seconds=0.5, limits=limits())
    with pytest.raises(LLMError) as raised:
        await asyncio.wait_for(llm.start(), 30)
    assert str(raised.value).startswith(f"cannot reach the model server at {url}: ")
    assert str(raised.value).endswith("(is it running?)")
    await llm.close()


async def test_start_waits_for_a_busy_server_and_says_what_it_waits_for(server, caplog):
    server.busy_for(6)  # llama.cpp's Python server answers /models only after its current generation
    llm = make_llm(server, startup_seconds=30)

    with caplog.at_level("WARNING", logger="agent.llm.openai"):
        await llm.start()

    # The first check gives up after 5 s and says so; the second, twice as patient, gets the answer.
    assert len([r for r in server.requests if r.path == "/v1/models"]) == 2
    assert (f"the model server at {server.base_url} is busy (no answer to GET /models within 5 s); waiting for it"
            in caplog.text)
    await llm.close()


async def test_start_against_a_server_busy_for_longer_than_the_budget_says_it_is_busy_not_down(server):
    server.busy_for(60)
    llm = make_llm(server, startup_seconds=0.5)

    with pytest.raises(LLMError) as raised:
        await llm.start()

    message = str(raised.value)
    assert message.startswith(f"the model server at {server.base_url} is running but busy: no answer to GET /models")
    assert "OPENAI_STARTUP_SECONDS" in message and "cannot reach" not in message
    await llm.close()


async def test_a_busy_status_at_start_is_asked_again_with_growing_pauses(server, caplog):
    server.models_statuses = [503, 503]  # then the model list
    llm = make_llm(server, startup_seconds=30)

    with caplog.at_level("WARNING", logger="agent.llm.openai"):
        await llm.start()

    arrivals = [r.received_at for r in server.requests if r.path == "/v1/models"]
    assert len(arrivals) == 3
    assert arrivals[2] - arrivals[1] > arrivals[1] - arrivals[0] >= 0.9  # 1 s, then 2 s
    assert "is busy (it answered 503" in caplog.text
    await llm.close()


async def test_credentials_in_the_server_address_are_never_shown():
    port = closed_port()
    llm = OpenAILLM(base_url=f"http://admin:hunter2@127.0.0.1:{port}/v1", model="fake-qwen", startup_seconds=1)

    with pytest.raises(LLMError) as raised:
        await llm.start()

    assert str(raised.value).startswith(f"cannot reach the model server at http://127.0.0.1:{port}/v1: ")
    assert "hunter2" not in str(raised.value)
    await llm.close()


async def test_build_llm_makes_the_openai_backend_from_settings(server, tmp_path):
    settings = Settings.of(llm_backend="openai", openai_base_url=server.base_url, model="Qwen/Qwen2.5-7B-Instruct",
                           tokenizer_vocab_path=tmp_path / "absent.tiktoken")
    llm = build_llm(settings)
    server.add("hello")

    await llm.complete(ModelRequest([user("hi")]))

    assert isinstance(llm, OpenAILLM)
    assert server.chat_requests[0].body["model"] == "Qwen/Qwen2.5-7B-Instruct"  # OPENAI_MODEL empty: MODEL
    assert llm.count_tokens("hello world") > 0
    await llm.close()


# --- End to end: `qwenbot ask` with LLM_BACKEND=openai, in a subprocess, against the fake server ---------------

ARTICLE_QUESTION = "请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？"
# What Qwen2.5-Instruct writes for the article's question; the server cuts it at the stop word.
QWEN_LOOKUP = ("Thought: 我应该使用课程信息数据库API来查询大模型技术实战课程的课时。\n"
               "Action: course_query\n"
               'Action Input: {"course_name": "大模型技术实战"}\n'
               "Observation: (the model would invent a result here)")
QWEN_FINAL = " 我现在知道最终答案了。\nFinal Answer: 大模型技术实战课程目前一共上线了200节课。"


STEP = Grammar("react_step", 'start: "Thought: " /[^\\n]+/\n')


@pytest.mark.parametrize("style, field, value", [
    ("vllm", "structured_outputs", {"grammar": STEP.lark}),
    ("sglang", "ebnf", "%llguidance {}\n" + STEP.lark),
    ("llama.cpp", "grammar", "%llguidance {}\n" + STEP.lark),
])
async def test_the_grammar_goes_in_the_field_each_server_takes(server, style, field, value):
    server.add("Thought: ok")
    llm = make_llm(server, grammar=style)
    await llm.complete(ModelRequest([user("Question: ?")], grammar=STEP))
    await llm.close()
    assert server.chat_requests[0].body[field] == value


async def test_without_openai_grammar_no_grammar_is_sent(server, llm):
    server.add("Thought: ok")
    await llm.complete(ModelRequest([user("Question: ?")], grammar=STEP))
    assert set(server.chat_requests[0].body) == {"model", "messages", "max_tokens", "stream", "stream_options"}


async def test_a_server_that_refuses_the_grammar_gets_the_request_again_without_it_and_none_after(server, caplog):
    server.add(error(400, "unknown field: ebnf"), "Thought: first", "Thought: second")
    llm = make_llm(server, grammar="sglang")

    first = await llm.complete(ModelRequest([user("Question: ?")], grammar=STEP))
    second = await llm.complete(ModelRequest([user("Question: ?")], grammar=STEP))
    await llm.close()

    assert (first.text, second.text) == ("Thought: first", "Thought: second")
    assert ["ebnf" in request.body for request in server.chat_requests] == [True, False, False]
    refusals = [r.getMessage() for r in caplog.records if "sending no grammar" in r.getMessage()]
    assert len(refusals) == 1 and "answered 400: unknown field: ebnf" in refusals[0]


async def test_other_errors_with_a_grammar_are_errors_as_before(server):
    server.add(error(401, "bad key"))
    llm = make_llm(server, grammar="vllm", max_retries=0)
    with pytest.raises(LLMError, match="answered 401"):
        await llm.complete(ModelRequest([user("Question: ?")], grammar=STEP))
    await llm.close()
    assert len(server.chat_requests) == 1


def qwenbot_ask(server_url: str, tmp_path: Path, question: str, **env: str) -> subprocess.CompletedProcess:
    """Run `qwenbot ask` as a user would, configured only through the environment (no .env: cwd is tmp_path)."""
    settings = {"LLM_BACKEND": "openai", "OPENAI_BASE_URL": server_url, "OPENAI_MODEL": "fake-qwen",
                "DATABASE_PATH": str(tmp_path / "bot.sqlite3"), "AGENT_MODE": "react", "LOG_LEVEL": "WARNING",
                "TOKENIZER_VOCAB_PATH": str(REPO / "data" / "qwen.tiktoken"), "OPENAI_FIRST_TOKEN_SECONDS": "10",
                **env}
    environ = {**os.environ, **settings, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "bot.program.cli", "ask", question], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=60)


def last_line(output: str) -> str:
    """The command's own message: the last line (a log warning, e.g. a missing vocabulary file, may precede it)."""
    return output.strip().splitlines()[-1]


def stored_steps(tmp_path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(tmp_path / "bot.sqlite3") as db:
        return db.execute("SELECT kind, action FROM steps ORDER BY turn_id, position").fetchall()


def test_qwenbot_ask_completes_a_react_turn_with_a_course_lookup(server, tmp_path):
    server.add(QWEN_LOOKUP, QWEN_FINAL)

    done = qwenbot_ask(server.base_url, tmp_path, ARTICLE_QUESTION)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "大模型技术实战课程目前一共上线了200节课。"
    first, second = (request.body for request in server.chat_requests)
    assert first["stop"] == second["stop"] == ["Observation:", "\nQuestion:"]  # the agent's ReAct stops
    # The second call carries the trace, with the real observation, folded into the user's message.
    assert [m["role"] for m in second["messages"]] == ["system", "user"]
    prompt = second["messages"][-1]["content"]
    assert prompt.startswith(first["messages"][-1]["content"] + "\nThought: 我应该使用课程信息数据库API")
    assert '\nObservation: {"课程名称": "大模型技术实战", "课时": 200' in prompt
    assert "invent" not in prompt and prompt.endswith("\nThought:")
    assert stored_steps(tmp_path) == [("tool", "course_query"), ("final", "")]


def test_qwenbot_ask_with_openai_grammar_sends_each_steps_grammar(server, tmp_path):
    server.add(QWEN_LOOKUP, QWEN_FINAL)

    done = qwenbot_ask(server.base_url, tmp_path, ARTICLE_QUESTION, OPENAI_GRAMMAR="vllm")

    assert done.returncode == 0, done.stderr
    first, second = (request.body["structured_outputs"]["grammar"] for request in server.chat_requests)
    assert first.startswith('start: "Thought: " thought')  # a fresh step
    assert second.startswith('start: " " thought')  # continuing after the trace's "Thought:"
    # The question names one course: the lookup is held to it (entity linking), not to every course in the database.
    assert '"大模型技术实战"' in first and "机器学习实战" not in first and "AI数据分析" not in first


def test_qwenbot_ask_still_answers_after_two_server_errors(server, tmp_path):
    server.add(error(500), error(500), QWEN_LOOKUP, QWEN_FINAL)

    done = qwenbot_ask(server.base_url, tmp_path, ARTICLE_QUESTION)

    assert done.returncode == 0, done.stderr
    assert "200" in done.stdout
    assert len(server.chat_requests) == 4


def test_qwenbot_ask_against_a_silent_server_says_it_timed_out(server, tmp_path):
    server.add(HANG)

    done = qwenbot_ask(server.base_url, tmp_path, ARTICLE_QUESTION, OPENAI_FIRST_TOKEN_SECONDS="1")

    assert done.returncode == 2
    assert last_line(done.stderr) == (f"qwenbot: model server at {server.base_url} sent no answer within 1 s "
                                      "(OPENAI_FIRST_TOKEN_SECONDS)")
    assert "Traceback" not in done.stderr


def test_qwenbot_ask_against_an_unreachable_server_fails_in_one_line(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/v1"

    done = qwenbot_ask(url, tmp_path, ARTICLE_QUESTION)

    assert done.returncode == 2
    assert last_line(done.stderr).startswith(f"qwenbot: cannot reach the model server at {url}: ")
    assert "Traceback" not in done.stderr
