"""The decode loop with speculative tokens (agent/llm/engine/decode_loop.py, speculative.py) on the real offline
model: the text is the text of one token a step, alone and in a batch, with and without a grammar; and a reply
that copies from its prompt takes fewer passes.

Two `LocalLLM`s on SmolLM2-135M in fp32 (exact: a step's width does not change a greedy choice there), one with
speculative tokens off (SPECULATIVE_TOKENS=0) and one with the defaults.
"""

from __future__ import annotations

import asyncio
import re

import pytest
import pytest_asyncio

from agent.conversations import ReactConversation, TurnRules
from agent.grammar import GrammarLimits
from agent.llm.base import ModelRequest
from agent.llm.engine.speculative import SpeculativeLimits
from tests.real_model import real_model_test, started_local_llm, worker_log_watched

QUESTION = "请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？"
OBSERVATION = '{"course": "大模型技术实战", "lessons": 200, "updates_per_week": 3, "hours_per_update": 2}'
COPYING = [{"role": "user", "content": "Write the word 'banana' twenty times, separated by commas."}]
HI = [{"role": "user", "content": "Say hi."}]
STORY = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engines(tmp_path_factory):
    """The same model with speculative tokens off and on (sharing one converted copy)."""
    converted = tmp_path_factory.mktemp("converted")
    plain = await started_local_llm(converted_dir=converted, prefix_cache_mb=64, speculative=SpeculativeLimits(0, 0))
    speculating = await started_local_llm(converted_dir=converted, prefix_cache_mb=64)
    yield plain, speculating
    await plain.close()
    await speculating.close()


@pytest.fixture(scope="module")
def tools(turn_tools):
    """The shipped tools as a turn sees them (conftest.py)."""
    return turn_tools


def second_call(tools) -> list[dict]:
    """A ReAct turn's second call: the tool's observation is in the prompt, for the answer to copy from."""
    first = ReactConversation([], QUESTION, tools, TurnRules()).request().messages
    trace = ('Thought: 我需要查询课程信息。\nAction: course_query\nAction Input: {"course_name": "大模型技术实战"}\n'
             f"Observation: {OBSERVATION}\nThought:")
    return [*first, {"role": "assistant", "content": trace}]


def passes_logged(messages: list[str]) -> list[int]:
    return [int(found.group(1)) for message in messages
            if (found := re.match(r"decoded \d+ rows in (\d+) passes", message))]


@real_model_test
async def test_with_speculative_tokens_a_reply_is_the_same_and_copying_takes_fewer_passes(engines) -> None:
    plain, speculating = engines
    logged: dict[str, list[str]] = {"plain": [], "speculating": []}
    replies = {}
    for name, llm in (("plain", plain), ("speculating", speculating)):
        with worker_log_watched(logged[name].append):
            replies[name] = await llm.complete(ModelRequest(COPYING, max_new_tokens=48))
            # A caller is answered as its row ends, before the batch logs its passes: the next batch comes after.
            await llm.complete(ModelRequest(HI, max_new_tokens=1))
    assert replies["speculating"].text == replies["plain"].text
    assert replies["speculating"].text.lower().count("banana") >= 5  # the reply does copy
    assert passes_logged(logged["plain"])[0] == 48
    assert passes_logged(logged["speculating"])[0] < 0.75 * 48


@real_model_test
async def test_in_a_batch_every_row_is_the_same_with_speculative_tokens(engines, tools) -> None:
    plain, speculating = engines
    calls = [dict(messages=second_call(tools), stop=["Observation:"], max_new_tokens=40),
             dict(messages=COPYING, max_new_tokens=40), dict(messages=STORY, max_new_tokens=40)]
    alone = [await plain.complete(ModelRequest(**call)) for call in calls]
    together = await asyncio.gather(*(speculating.complete(ModelRequest(**call)) for call in calls))
    assert [reply.text for reply in together] == [reply.text for reply in alone]
    assert [reply.completion_tokens for reply in together] == [reply.completion_tokens for reply in alone]


@real_model_test
async def test_a_constrained_step_is_the_same_with_speculative_tokens(engines, tools) -> None:
    plain, speculating = engines
    named = tuple(tool.name for tool in tools if tool.named_in(QUESTION))
    request = ReactConversation([], QUESTION, tools, TurnRules(GrammarLimits(thought_max_tokens=16), named)).request()
    call = dict(messages=request.messages, stop=request.stop, max_new_tokens=64, grammar=request.grammar)
    plain_step = await plain.complete(ModelRequest(**call))
    speculated_step = await speculating.complete(ModelRequest(**call))
    assert speculated_step.text == plain_step.text
    assert "Action Input:" in speculated_step.text


@real_model_test
@pytest.mark.parametrize("limit", [1, 2, 7])
async def test_speculative_tokens_never_run_past_the_token_limit(engines, limit: int) -> None:
    plain, speculating = engines
    expected = await plain.complete(ModelRequest(COPYING, max_new_tokens=limit))
    reply = await speculating.complete(ModelRequest(COPYING, max_new_tokens=limit))
    assert reply.completion_tokens == limit and reply.text == expected.text
