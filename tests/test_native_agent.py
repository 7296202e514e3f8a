"""AGENT_MODE=native: tools through the chat template, <tool_call> JSON back, results as `tool` messages."""

from __future__ import annotations

from agent.llm.base import Completion, ToolCall
from agent.llm.scripted import ScriptedLLM
from agent.loop import Agent, AgentLimits
from agent.memory import Memory, Session
from agent.prompts import ANSWER_NOW_NOTE
from tools.settings import ToolSettings

SESSION = Session(id="native:1", chat_key="native")
LOOKUP = '<tool_call>\n{"name": "course_query", "arguments": {"course_name": "大模型技术实战"}}\n</tool_call>'


def native_agent(db, registry, replies, **limits):
    llm = ScriptedLLM(replies)
    return Agent(llm, registry, ToolSettings(db, registry), Memory(db), AgentLimits(mode="native", **limits)), llm


async def test_native_lookup_then_answer(db, registry):
    agent, llm = native_agent(db, registry, [LOOKUP, "大模型技术实战课程目前一共上线了200节课。"])
    result = await agent.run(SESSION, "我们的大模型技术实战课程目前一共上线了多少节？")

    assert "200" in result.answer
    assert [s.action for s in result.tool_steps] == ["course_query"]
    first, second = llm.requests
    assert [t["function"]["name"] for t in first.tools] == ["course_query", "course_list", "calculator"]
    assert first.stop == ()
    assistant, tool_message = second.messages[-2:]
    assert assistant["tool_calls"][0]["function"] == {"name": "course_query",
                                                      "arguments": {"course_name": "大模型技术实战"}}
    assert tool_message["role"] == "tool" and '"课时": 200' in tool_message["content"]
    assert tool_message["tool_call_id"] == assistant["tool_calls"][0]["id"]


async def test_native_thinking_is_not_a_call(db, registry):
    agent, llm = native_agent(db, registry, ['<think>I could call <tool_call>{"name": "calculator"}</tool_call></think>6'])
    result = await agent.run(SESSION, "3*2?")
    assert result.answer == "6" and result.tool_steps == []


async def test_native_server_parsed_calls_and_repeated_call_guard(db, registry):
    call = Completion("", tool_calls=(ToolCall("calculator", '{"expression": "3*2"}', "c1"),))
    again = Completion("", tool_calls=(ToolCall("calculator", '{"expression": "3*2"}', "c2"),))
    agent, llm = native_agent(db, registry, [call, again, "6"])
    result = await agent.run(SESSION, "3*2?")
    assert [s.kind for s in result.tool_steps] == ["tool", "repeated"]
    # The repeat is not run, not answered with its result again: tools are withdrawn and the answer asked for.
    asked = llm.requests[2]
    assert asked.tools is None and asked.messages[-1] == {"role": "user", "content": ANSWER_NOW_NOTE}
    assert sum(m["role"] == "tool" for m in asked.messages) == 1
    assert result.answer == "6" and len(llm.requests) == 3


async def test_native_step_limit_asks_without_tools(db, registry):
    calls = [f'<tool_call>{{"name": "course_query", "arguments": {{"course_name": "c{i}"}}}}</tool_call>'
             for i in range(2)]
    agent, llm = native_agent(db, registry, [*calls, "我没找到这些课程。"], max_steps=2)
    result = await agent.run(SESSION, "查课程")
    assert result.status == "step_limit" and result.answer == "我没找到这些课程。"
    assert llm.requests[-1].tools is None


async def test_native_malformed_call_is_explained_then_recovered(db, registry):
    agent, llm = native_agent(db, registry, ["<tool_call>{oops</tool_call>", LOOKUP, "200节"])
    result = await agent.run(SESSION, "大模型技术实战多少节？")
    assert result.answer == "200节"
    assert "not valid JSON" in llm.requests[1].messages[-1]["content"]
