"""Grammar-constrained decoding on the real offline model (SmolLM2-135M-Instruct): the per-row masks in a batch.

The model cannot follow the ReAct format on its own (it repeats the question, or writes a Thought and stops); under
the step grammar built from the tools it must produce a step that parses and whose arguments fit the tool's
schema, while a row without a grammar in the same batch is left exactly as it would be alone.
"""

from __future__ import annotations

import asyncio
import re
from contextlib import contextmanager
from typing import Iterator

import pytest
import pytest_asyncio

from agent.conversations import ReactConversation, TurnRules
from agent.errors import LLMError
from agent.grammar import Grammar, GrammarLimits
from agent.llm.base import ModelRequest
from agent.llm.local import LocalLLM
from agent.react import parse_react
from agent.steps import ToolRequest
from tools.registry import validation_problem
from tests.real_model import GGUF, real_model_test, started_local_llm, worker_log_watched

QUESTION = "请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
COURSES = ["大模型技术实战", "机器学习实战", "深度学习实战", "AI数据分析"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def llm():
    """The offline model behind `LocalLLM`, started once for the whole module."""
    backend = await started_local_llm()
    yield backend
    await backend.close()


@pytest.fixture(scope="module")
def tools(turn_tools):
    """The shipped tools as a turn sees them (conftest.py)."""
    return turn_tools


@contextmanager
def batch_sizes() -> Iterator[list[int]]:
    """The size of every batch the model thread runs meanwhile (the worker logs each one)."""
    sizes: list[int] = []

    def note(message: str) -> None:
        if (found := re.match(r"generating a batch of (\d+) ", message)) is not None:
            sizes.append(int(found.group(1)))

    with worker_log_watched(note):
        yield sizes


async def in_one_batch(llm: LocalLLM, *calls: dict) -> list:
    """Run `calls` (keyword arguments of `complete`) as one batch, and check that they were.

    A short request keeps the model thread busy first; everything submitted meanwhile is taken as the next batch.
    """
    with batch_sizes() as sizes:
        busy = asyncio.create_task(llm.complete(ModelRequest(FRANCE, max_new_tokens=2)))
        await asyncio.sleep(0.05)
        results = await asyncio.gather(*(llm.complete(ModelRequest(**call)) for call in calls))
        await busy
    assert len(calls) in sizes, sizes
    return results


@real_model_test
async def test_a_constrained_step_parses_and_validates_beside_an_untouched_unconstrained_row(llm, tools):
    named = tuple(tool.name for tool in tools if tool.named_in(QUESTION))  # the first-step policy's choice
    assert named == ("course_query", "course_list")
    conversation = ReactConversation([], QUESTION, tools, TurnRules(GrammarLimits(thought_max_tokens=16), named))
    request = conversation.request()
    # 96 tokens: a 16-token Thought, then up to ~60 of Action, the course and the fields it may ask for.
    constrained = dict(messages=request.messages, stop=request.stop, max_new_tokens=96, grammar=request.grammar)
    free = dict(messages=FRANCE, max_new_tokens=10)
    free_alone = await llm.complete(ModelRequest(**free))

    step, free_batched = await in_one_batch(llm, constrained, free)

    assert free_batched.text == free_alone.text  # the row without a grammar is exactly as it is alone
    assert free_batched.text.startswith("The capital of France is Paris")
    decision = parse_react(step.text, tools)
    assert isinstance(decision, ToolRequest), step.text
    assert decision.input_error is None and decision.tool in [tool.name for tool in tools]
    tool = next(tool for tool in tools if tool.name == decision.tool)
    assert validation_problem(tool, decision.arguments) is None  # valid against the narrowed schema itself
    if tool.name == "course_query":
        assert decision.arguments["course_name"] in COURSES
    assert step.finish_reason == "stop"  # the grammar ended the reply after the Action Input, as Observation: would


@real_model_test
async def test_without_the_grammar_the_same_prompt_does_not_give_a_step(llm, tools):
    """Why the grammar is needed: alone, this model does not write a ReAct step for the article's question."""
    request = ReactConversation([], QUESTION, tools).request()
    assert request.grammar is None
    reply = await llm.complete(ModelRequest(request.messages, stop=request.stop, max_new_tokens=24))
    assert not isinstance(parse_react(reply.text, tools), ToolRequest), reply.text


@real_model_test
async def test_a_grammar_that_does_not_compile_fails_only_its_own_call(llm):
    broken = Grammar("react_step", "start: undefined_rule\n")
    results = await asyncio.gather(llm.complete(ModelRequest(FRANCE, max_new_tokens=4, grammar=broken)),
                                   llm.complete(ModelRequest(FRANCE, max_new_tokens=4)), return_exceptions=True)
    assert isinstance(results[0], LLMError) and "grammar does not compile" in str(results[0])
    assert results[1].text.startswith("The capital")


@real_model_test
async def test_a_constrained_row_paused_for_a_newcomer_resumes_its_grammar_streams_and_ends_as_alone(llm, tools):
    """The matcher belongs to the row, not the batch: paused mid-step so that a newcomer can join, the row resumes
    in the next batch from its KV in the prefix cache, its grammar where it left it; its text streams throughout,
    and the step is the one it writes alone without any cache."""
    named = tuple(tool.name for tool in tools if tool.named_in(QUESTION))  # a tool call is required: an Action
    request = ReactConversation([], QUESTION, tools, TurnRules(GrammarLimits(thought_max_tokens=16), named)).request()
    call = dict(messages=request.messages, stop=request.stop, max_new_tokens=64, grammar=request.grammar)
    alone = await llm.complete(ModelRequest(**call))
    cached = LocalLLM(str(GGUF), device_map="cpu", dtype="float32", batch_size=8, prefix_cache_mb=64)
    await cached.start()
    pieces: list[str] = []
    newcomer: list[asyncio.Future] = []

    def listen(piece: str) -> None:
        pieces.append(piece)
        if len(pieces) == 2:  # under way: a newcomer arrives, and the batch pauses for it to join
            newcomer.append(asyncio.ensure_future(cached.complete(ModelRequest(FRANCE, max_new_tokens=4))))

    try:
        with batch_sizes() as sizes:
            step = await cached.complete(ModelRequest(**call, on_text=listen))
            await newcomer[0]
    finally:
        await cached.close()

    assert sizes == [1, 2]  # alone, then resumed beside the newcomer
    assert step.text == alone.text and isinstance(parse_react(step.text, tools), ToolRequest), step.text
    assert "".join(pieces) == step.text
