"""The agent loop with a scripted model: real tools, a real SQLite file, the prompts the model would see."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from agent.errors import LLMCancelled, LLMError, LLMTimeout
from agent.events import AnswerText, ModelCall, ToolFinished, ToolStarted
from agent.grammar import GrammarLimits
from agent.llm.base import CancelToken
from agent.llm.scripted import ScriptedLLM
from agent.loop import Agent, AgentLimits
from agent.memory import Memory, Session
from agent.prompts import REACT_STOP, STEP_LIMIT_NOTE
from db import Database
from tools.registry import Tool, ToolRegistry
from tools.settings import ToolSettings

ARTICLE_QUESTION = "请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？"
# A Qwen-shaped trace: what Qwen2.5-Instruct writes for the article's question, stop word included.
QWEN_LOOKUP = (
    "Thought: 我应该使用课程信息数据库API来查询大模型技术实战课程的课时。\n"
    "Action: course_query\n"
    'Action Input: {"course_name": "大模型技术实战"}\n'
    "Observation:"
)
QWEN_FINAL = " 我现在知道最终答案了。\nFinal Answer: 大模型技术实战课程目前一共上线了200节课。"
SESSION = Session(id="test:1", chat_key="test")


def lookup_then_answer(request) -> str:
    """A scripted reply that fits whichever step of the article's question it is asked for (turns run at once)."""
    return QWEN_FINAL if REACT_STOP in request.last_content else QWEN_LOOKUP


def make_agent(db: Database, registry: ToolRegistry, replies, *, token_seconds: float = 0.0,
               **limits) -> tuple[Agent, ScriptedLLM]:
    llm = ScriptedLLM(replies, token_seconds=token_seconds)
    agent = Agent(llm, registry, ToolSettings(db, registry), Memory(db), AgentLimits(**limits))
    return agent, llm


async def stored_steps(db: Database) -> list[tuple]:
    rows = await db.fetchall("SELECT kind, action, action_input, error FROM steps ORDER BY turn_id, position")
    return [tuple(row) for row in rows]


async def history_rows(db: Database, session_id: str = SESSION.id) -> list[tuple[str, str]]:
    rows = await db.fetchall("SELECT role, content FROM messages WHERE session_id = ? ORDER BY id", (session_id,))
    return [tuple(row) for row in rows]


async def test_article_question_is_answered_after_one_lookup(db, registry):
    agent, llm = make_agent(db, registry, [QWEN_LOOKUP, QWEN_FINAL])
    result = await agent.run(SESSION, ARTICLE_QUESTION)

    assert "200" in result.answer
    assert result.status == "answered"
    assert [(s.kind, s.action) for s in result.tool_steps] == [("tool", "course_query")]
    assert await stored_steps(db) == [("tool", "course_query", '{"course_name": "大模型技术实战"}', None),
                                      ("final", "", "", None)]
    observation = (await db.fetchone("SELECT observation FROM steps WHERE kind = 'tool'"))[0]
    assert json.loads(observation)["课时"] == 200


async def test_an_answer_that_runs_on_into_a_new_question_ends_at_it(db, registry):
    rambling = " I now know the final answer\nFinal Answer: 200 节。\n\nQuestion: 机器学习实战呢？\nThought:"
    agent, llm = make_agent(db, registry, [QWEN_LOOKUP, rambling])
    result = await agent.run(SESSION, ARTICLE_QUESTION)

    assert result.status == "answered" and result.answer == "200 节。"  # the invented exchange never reaches the user


async def test_trace_continues_in_the_same_assistant_turn(db, registry):
    agent, llm = make_agent(db, registry, [QWEN_LOOKUP, QWEN_FINAL])
    await agent.run(SESSION, ARTICLE_QUESTION)

    first, second = llm.requests
    assert first.stop == (REACT_STOP, "\nQuestion:")
    assert first.messages[-1]["role"] == "user" and first.messages[-1]["content"].endswith(f"Question: {ARTICLE_QUESTION}")
    continued = second.messages[-1]
    assert continued["role"] == "assistant"
    assert continued["content"].startswith(QWEN_LOOKUP[: -len("\nObservation:")])
    assert '\nObservation: {"课程名称": "大模型技术实战", "课时": 200' in continued["content"]
    assert continued["content"].endswith("\nThought:")
    # The question is asked once: the follow-up is not a new user turn (the article's mistake).
    assert [m["role"] for m in second.messages].count("user") == 1


async def test_system_message_asks_for_the_users_language(db, registry):
    agent, llm = make_agent(db, registry, [QWEN_LOOKUP, QWEN_FINAL])
    await agent.run(SESSION, ARTICLE_QUESTION)
    system = llm.requests[0].messages[0]
    assert system["role"] == "system" and "same language" in system["content"]


async def test_two_tools_lessons_then_calculator(db, registry):
    replies = [
        'Thought: 先查课程。\nAction: course_query\nAction Input: {"course_name": "大模型技术实战"}\nObservation:',
        ' 每周更新3次，每次2小时，算一下。\nAction: calculator\nAction Input: {"expression": "3 * 2"}\nObservation:',
        " I now know the final answer\nFinal Answer: 大模型技术实战每周更新 6 小时。",
    ]
    agent, llm = make_agent(db, registry, replies)
    result = await agent.run(SESSION, "大模型技术实战每周更新多少小时？")

    assert [s.action for s in result.tool_steps] == ["course_query", "calculator"]
    assert result.tool_steps[1].observation == "3 * 2 = 6"
    assert "6" in result.answer
    assert "Observation: 3 * 2 = 6\nThought:" in llm.requests[2].messages[-1]["content"]


async def test_tool_error_is_observed_and_recovered_on_next_step(db, registry):
    replies = [
        'Thought: 算一下\nAction: calculator\nAction Input: {"expression": "3 * x"}\nObservation:',
        ' 表达式写错了\nAction: calculator\nAction Input: {"expression": "3 * 2"}\nObservation:',
        " done\nFinal Answer: 6",
    ]
    agent, llm = make_agent(db, registry, replies)
    result = await agent.run(SESSION, "3乘2是多少")

    assert result.answer == "6"
    assert [s.error for s in result.tool_steps] == ["tool_error", None]
    assert "Observation: Error: only numbers" in llm.requests[1].messages[-1]["content"]


async def test_unknown_tool_goes_back_to_the_model(db, registry):
    replies = ['Thought: x\nAction: weather\nAction Input: {"city": "北京"}\nObservation:', " ok\nFinal Answer: 不知道"]
    agent, llm = make_agent(db, registry, replies)
    result = await agent.run(SESSION, "北京天气？")

    assert result.tool_steps[0].error == "unknown_tool"
    assert "no tool named 'weather'" in llm.requests[1].messages[-1]["content"]
    assert "course_query" in result.tool_steps[0].observation


async def test_invalid_arguments_are_explained_to_the_model(db, registry):
    replies = ['Thought: x\nAction: course_query\nAction Input: {"name": "大模型"}\nObservation:', " ok\nFinal Answer: 再试"]
    agent, llm = make_agent(db, registry, replies)
    result = await agent.run(SESSION, "大模型?")
    assert result.tool_steps[0].error == "invalid_arguments"
    assert "course_name" in result.tool_steps[0].observation


async def test_step_limit_asks_once_more_for_the_answer(db, registry):
    lookups = [f'Thought: again\nAction: course_query\nAction Input: {{"course_name": "课程{i}"}}\nObservation:'
               for i in range(3)]
    agent, llm = make_agent(db, registry, [*lookups, " 根据已知信息：没有找到。"], max_steps=3)
    result = await agent.run(SESSION, "查课程")

    assert result.status == "step_limit"
    assert result.answer == "根据已知信息：没有找到。"
    assert len(llm.requests) == 4
    assert llm.requests[3].messages[-1]["content"].endswith("Final Answer:")


async def test_the_forced_final_request_reads_like_the_format(db, registry):
    lookups = [f'Thought: again\nAction: course_query\nAction Input: {{"course_name": "课程{i}"}}\nObservation:'
               for i in range(2)]
    agent, llm = make_agent(db, registry, [*lookups, " 没有找到。"], max_steps=2)
    await agent.run(SESSION, "查课程")

    trace = llm.requests[2].messages[-1]["content"]
    # Each Thought says something, each Observation follows an Action: the note closes the last Observation.
    assert not re.search(r"Thought:[ \t]*\n", trace), trace
    assert trace.count("Observation:") == 2 and trace.count("Action:") == 2
    last_observation = trace[trace.rindex("Observation:"):]
    assert last_observation.endswith(f"\n({STEP_LIMIT_NOTE})\nThought: I now know the final answer\nFinal Answer:")


async def test_step_limit_with_no_final_words_gives_an_honest_apology(db, registry):
    lookup = 'Thought: again\nAction: course_query\nAction Input: {"course_name": "x%d"}\nObservation:'
    agent, _ = make_agent(db, registry, [lookup % 1, lookup % 2, ""], max_steps=2)
    result = await agent.run(SESSION, "查课程")
    assert result.status == "step_limit"
    assert "抱歉" in result.answer and "步骤" in result.answer


async def test_repeated_identical_call_is_not_run_again(db, registry):
    calls = []

    async def counting(expression: str) -> str:
        calls.append(expression)
        return "6"

    counted = ToolRegistry.of([Tool("calculator", "计算器", "算术", {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}, counting)])
    same = 'Thought: x\nAction: calculator\nAction Input: {"expression": "3*2"}\nObservation:'
    agent, llm = make_agent(db, counted, [same, " again\nAction: calculator\nAction Input: {'expression': '3*2'}\n",
                                          " 6"])
    result = await agent.run(SESSION, "3*2")

    assert calls == ["3*2"]
    assert [s.kind for s in result.tool_steps] == ["tool", "repeated"]
    # The repeat is neither run nor replayed: the trace goes on from the first result straight to the answer,
    # and the grammar allows nothing else.
    asked = llm.requests[2].messages[-1]["content"]
    assert asked.endswith("Observation: 6\nThought: I now know the final answer\nFinal Answer:")
    assert asked.count("Action: calculator") == 1 and "already called" not in asked
    assert llm.requests[2].grammar.kind == "react_final"
    assert result.answer == "6" and len(llm.requests) == 3


async def test_format_reminder_then_a_proper_answer(db, registry):
    agent, llm = make_agent(db, registry, ["我觉得是6吧", "Thought: 我知道了\nFinal Answer: 3乘2等于6"])
    result = await agent.run(SESSION, "3乘2是多少？")

    assert result.answer == "3乘2等于6"
    assert "did not follow the format" in llm.requests[1].messages[-1]["content"]
    assert [s.kind for s in result.steps] == ["format_error", "final"]


async def test_a_model_that_never_follows_the_format_gets_an_apology_not_its_raw_text(db, registry):
    rambling = ["I now know the answer\n\nEnd!", "Thought: I now know the answer"]
    agent, _ = make_agent(db, registry, rambling)
    result = await agent.run(SESSION, "How many lessons does the LLM course have?")

    assert result.status == "gave_up"
    assert result.answer.startswith("Sorry") and "/trace" in result.answer
    assert all(raw not in result.answer for raw in rambling)
    assert [s.kind for s in result.steps] == ["format_error", "format_error"]
    assert (await history_rows(db))[-1] == ("assistant", result.answer)


async def test_empty_replies_end_in_an_apology(db, registry):
    agent, _ = make_agent(db, registry, ["", "   "])
    result = await agent.run(SESSION, ARTICLE_QUESTION)
    assert result.status == "gave_up"
    assert result.answer.startswith("抱歉")
    assert await history_rows(db) == [("user", ARTICLE_QUESTION), ("assistant", result.answer)]


async def test_english_question_gets_an_english_apology(db, registry):
    agent, _ = make_agent(db, registry, ["", ""])
    result = await agent.run(SESSION, "How many lessons?")
    assert result.answer.startswith("Sorry")


async def test_huge_tool_output_is_truncated_for_the_model(db):
    async def flood() -> str:
        return "x" * 50_000

    registry = ToolRegistry.of([Tool("flood", "Flood", "floods", {"type": "object", "properties": {}}, flood)])
    agent, llm = make_agent(db, registry, ["Thought: go\nAction: flood\nAction Input: {}\n", " ok\nFinal Answer: done"],
                            observation_max_chars=100)
    result = await agent.run(SESSION, "flood")
    assert len(result.tool_steps[0].observation) < 200
    assert "truncated: 49900 more characters" in llm.requests[1].messages[-1]["content"]


async def test_events_show_each_step_and_stream_only_the_final_answer(db, registry):
    seen = []
    agent, _ = make_agent(db, registry, [QWEN_LOOKUP, QWEN_FINAL], token_seconds=0.001)
    result = await agent.run(SESSION, ARTICLE_QUESTION, on_event=seen.append)

    calls = [e for e in seen if isinstance(e, ModelCall)]
    started = [e for e in seen if isinstance(e, ToolStarted)]
    finished = [e for e in seen if isinstance(e, ToolFinished)]
    answers = [e.text for e in seen if isinstance(e, AnswerText)]
    assert [c.step for c in calls] == [1, 2]
    assert [(s.tool, s.label, s.shown_input) for s in started] == [("course_query", "🔎 查询课程数据库", "大模型技术实战")]
    assert finished[0].tool == "course_query" and '"课时": 200' in finished[0].observation
    assert seen.index(started[0]) < seen.index(finished[0]) < seen.index(calls[1])
    # The answer grows piece by piece, each text the one before plus more, and ends as the turn's answer.
    assert len(answers) > 3 and answers[-1] == result.answer
    assert all(later.startswith(earlier) for earlier, later in zip(answers, answers[1:]))
    assert not any("Thought" in text or "Action" in text or "我现在知道" in text for text in answers)


async def test_text_that_streamed_as_an_answer_is_taken_back_when_the_reply_calls_a_tool(db, registry):
    seen = []
    lookup = ('让我查一下。<tool_call>\n{"name": "course_query", "arguments": {"course_name": "大模型技术实战"}}\n'
              '</tool_call>')
    agent, _ = make_agent(db, registry, [lookup, "一共200节。"], token_seconds=0.001, mode="native")
    result = await agent.run(SESSION, ARTICLE_QUESTION, on_event=seen.append)

    answers = [e.text for e in seen if isinstance(e, AnswerText)]
    taken_back = answers.index("")
    assert answers[taken_back - 1] == "让我查一下。"  # it streamed while it looked like an answer
    assert all("tool_call" not in text for text in answers)
    assert answers[-1] == result.answer == "一共200节。"


async def test_an_observation_the_model_invents_before_its_answer_is_never_streamed(db, registry):
    seen = []
    invented = "Thought: 我猜\nObservation: 200\nFinal Answer: 200节"  # parse_react reads no answer here
    agent, _ = make_agent(db, registry, [invented, QWEN_LOOKUP, QWEN_FINAL], token_seconds=0.001)
    await agent.run(SESSION, ARTICLE_QUESTION, on_event=seen.append)
    assert "200节" not in [e.text for e in seen if isinstance(e, AnswerText)]


async def test_a_failing_event_sink_does_not_break_the_turn(db, registry):
    def broken(event) -> None:
        raise RuntimeError("telegram said no")

    agent, _ = make_agent(db, registry, [QWEN_LOOKUP, QWEN_FINAL], token_seconds=0.001)
    result = await agent.run(SESSION, ARTICLE_QUESTION, on_event=broken)
    assert "200" in result.answer


# --- memory ---------------------------------------------------------------------------------------------------


async def test_second_question_sees_the_first_answer_and_other_sessions_do_not(db, registry):
    agent, llm = make_agent(db, registry, [QWEN_LOOKUP, QWEN_FINAL, "Thought: 记得\nFinal Answer: 是的，200节。",
                                           "Thought: 不知道\nFinal Answer: 你问的是哪门课？"])
    await agent.run(SESSION, ARTICLE_QUESTION)
    await agent.run(SESSION, "你确定吗？")
    await agent.run(Session(id="test:other", chat_key="test"), "你确定吗？")

    same_session, other_session = llm.requests[2], llm.requests[3]
    roles = [m["role"] for m in same_session.messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert same_session.messages[1]["content"] == f"Question: {ARTICLE_QUESTION}"
    assert "200" in same_session.messages[2]["content"]
    assert "200节" not in other_session.text
    assert ARTICLE_QUESTION not in other_session.text


@pytest.mark.parametrize("layout", ["system", "question"])
async def test_the_next_turns_prompt_starts_with_the_last_ones_in_the_system_layout(db, registry, layout):
    """REACT_LAYOUT=system: instructions and tools lead, every question reads `Question: …`, so turn 2's messages
    begin with turn 1's system message and question (the cached part). Qwen's layout puts them after the history."""
    agent, llm = make_agent(db, registry, [QWEN_LOOKUP, QWEN_FINAL, "Thought: 记得\nFinal Answer: 是的，200节。"],
                            react_layout=layout)
    await agent.run(SESSION, ARTICLE_QUESTION)
    await agent.run(SESSION, "你确定吗？")

    first, _, second = llm.requests
    instructions = "You have access to the following tools:"
    if layout == "system":
        assert second.messages[:2] == first.messages[:2]
        assert instructions in second.messages[0]["content"] and "course_query" in second.messages[0]["content"]
        questions = [m["content"] for m in second.messages if m["role"] == "user"]
        assert questions == [f"Question: {ARTICLE_QUESTION}", "Question: 你确定吗？"]
    else:
        assert instructions not in second.messages[0]["content"]
        assert second.messages[1]["content"] == ARTICLE_QUESTION
        assert second.messages[-1]["content"].startswith(f"Answer the following questions as best you can. {instructions}")
        assert second.messages[-1]["content"].endswith("\n\nQuestion: 你确定吗？")


async def test_history_window_drops_oldest_turns_first_never_the_question(db, registry):
    answers = [f"Thought: t\nFinal Answer: answer number {i} " + " ".join(f"word{j}" for j in range(30))
               for i in range(5)]  # long, and not a loop (agent/repetition.py would shorten that)
    agent, llm = make_agent(db, registry, [*answers, "Thought: t\nFinal Answer: last"], history_token_budget=120,
                            grounded_answers=False)  # the answers number their words
    for i in range(5):
        await agent.run(SESSION, f"question {i}")
    long_question = "final question " * 100  # over the budget by itself: still asked
    await agent.run(SESSION, long_question)

    prompt = llm.requests[-1]
    assert "answer number 4" in prompt.text
    assert "answer number 0" not in prompt.text
    assert prompt.messages[-1]["content"].endswith(long_question)


async def test_a_turn_that_fails_midway_writes_nothing_to_history(db, registry):
    agent, _ = make_agent(db, registry, [QWEN_LOOKUP, LLMError("model crashed")])
    with pytest.raises(LLMError):
        await agent.run(SESSION, ARTICLE_QUESTION)
    assert await history_rows(db) == []
    failed = await db.fetchone("SELECT status, source_key FROM turns")
    assert tuple(failed) == ("error", None)  # the trace is kept for /stats, not the history


async def test_reset_clears_history_but_keeps_traces(db, registry):
    agent, llm = make_agent(db, registry, [QWEN_LOOKUP, QWEN_FINAL, "Thought: t\nFinal Answer: 新的开始"])
    await agent.run(SESSION, ARTICLE_QUESTION)
    assert await agent.memory.reset(SESSION.id) == 2
    await agent.run(SESSION, "你好")

    assert ARTICLE_QUESTION not in llm.requests[-1].text
    assert (await db.fetchone("SELECT count(*) FROM turns"))[0] == 2
    assert (await db.fetchone("SELECT count(*) FROM steps WHERE kind = 'tool'"))[0] == 1


async def test_same_source_key_is_stored_once(db, registry):
    agent, _ = make_agent(db, registry, ["Final Answer: a", "Final Answer: a"])
    first = await agent.run(SESSION, "hi", source_key="tg:update:7")
    second = await agent.run(SESSION, "hi", source_key="tg:update:7")
    assert first.turn_id == second.turn_id
    assert len(await history_rows(db)) == 2


async def test_disabled_tool_is_not_in_the_prompt_and_cannot_be_called(db, registry):
    await ToolSettings(db, registry).set_enabled("course_query", False, "test")
    agent, llm = make_agent(db, registry, [QWEN_LOOKUP, " ok\nFinal Answer: 查不到"])
    result = await agent.run(SESSION, ARTICLE_QUESTION)

    assert "course_query:" not in llm.requests[0].text
    assert "calculator:" in llm.requests[0].text
    assert result.tool_steps[0].error == "unknown_tool"


async def test_no_tools_enabled_is_a_plain_chat(db, registry):
    settings = ToolSettings(db, registry)
    for name in registry.names:
        await settings.set_enabled(name, False)
    agent, llm = make_agent(db, registry, ["你好！有什么可以帮你？"])
    result = await agent.run(SESSION, "你好")
    assert result.answer == "你好！有什么可以帮你？"
    assert llm.requests[0].last_content == "你好"
    assert llm.requests[0].stop == ()


# --- failures the model cannot fix ----------------------------------------------------------------------------


async def test_cancel_stops_the_turn(db, registry):
    llm = ScriptedLLM([QWEN_LOOKUP, QWEN_FINAL], delay=5)
    agent = Agent(llm, registry, ToolSettings(db, registry), Memory(db))
    cancel = CancelToken()
    task = asyncio.create_task(agent.run(SESSION, ARTICLE_QUESTION, cancel=cancel))
    await asyncio.sleep(0.05)
    cancel.cancel()
    with pytest.raises(LLMCancelled):
        await asyncio.wait_for(task, 2)
    assert await history_rows(db) == []


async def test_turn_timeout_is_an_llm_timeout(db, registry):
    llm = ScriptedLLM([QWEN_LOOKUP], delay=5)
    agent = Agent(llm, registry, ToolSettings(db, registry), Memory(db), AgentLimits(turn_timeout_seconds=0.1))
    with pytest.raises(LLMTimeout, match="longer than 0.1 seconds"):
        await agent.run(SESSION, ARTICLE_QUESTION)


async def test_agent_keeps_the_event_loop_free(db, registry):
    """Another coroutine keeps ticking while turns run: nothing in the agent blocks the loop."""
    llm = ScriptedLLM([lookup_then_answer] * 10, delay=0.02)
    agent = Agent(llm, registry, ToolSettings(db, registry), Memory(db))
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.005)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    await asyncio.gather(*(agent.run(Session(id=f"s{i}", chat_key="t"), ARTICLE_QUESTION) for i in range(5)))
    ticking.cancel()
    assert ticks >= 4  # five concurrent turns took about two 20 ms model calls; the ticker ran throughout


async def test_each_step_is_decoded_under_the_grammar_of_the_enabled_tools(db, registry):
    agent, llm = make_agent(db, registry, [QWEN_LOOKUP, QWEN_FINAL])
    await agent.run(SESSION, ARTICLE_QUESTION)

    first, second = (request.grammar for request in llm.requests)
    assert first.kind == second.kind == "react_step"
    assert first.lark.startswith('start: "Thought: "') and second.lark.startswith('start: " "')
    # The question names a course and asks for its lessons: the first step must look them up, for that course
    # alone; the list (which adds nothing to that lookup) is left out of the turn.
    assert "course_query" in first.lark and '"enum":["大模型技术实战"]' in first.lark
    assert '"const":["lessons"]' in first.lark
    assert not any(name in first.lark for name in ("course_list", "calculator", "Final Answer"))
    for name in ("course_query", "calculator", "Final Answer"):
        assert name in second.lark
    assert "course_list" not in second.lark
    # The prompt shows every course, the same for every question (its start stays cached)
    assert all(name in llm.requests[0].text for name in ("大模型技术实战", "机器学习实战", "深度学习实战", "AI数据分析"))


async def test_the_thought_and_the_arguments_fit_in_the_step_budget(db, registry):
    """A step cut at MAX_NEW_TOKENS could not parse (in its Thought) or call its tool (in its JSON): the Thought
    gets a quarter of the budget at most, free-text arguments a third of what is left after the action's syntax."""
    agent, llm = make_agent(db, registry, [QWEN_LOOKUP, QWEN_FINAL], max_new_tokens=128,
                            grammar=GrammarLimits(thought_max_tokens=128, string_max_chars=200))
    await agent.run(SESSION, ARTICLE_QUESTION)
    assert all("thought[max_tokens=32]:" in request.grammar.lark for request in llm.requests)
    # the calculator's own 200 lowered to (128 - 32 - 32) // 3 (offered after the first, required lookup)
    assert '"expression":{"type":"string","minLength":1,"maxLength":21' in llm.requests[1].grammar.lark
    assert "answer[max_tokens=88]:" in llm.requests[1].grammar.lark  # 128 - 32 for the Thought - 8
    agent, llm = make_agent(db, registry, [QWEN_LOOKUP, QWEN_FINAL], max_new_tokens=512,
                            grammar=GrammarLimits(thought_max_tokens=128))
    await agent.run(SESSION, ARTICLE_QUESTION)
    assert all("thought[max_tokens=128]:" in request.grammar.lark for request in llm.requests)


async def test_without_constrained_decoding_no_grammar_is_sent(db, registry):
    agent, llm = make_agent(db, registry, [QWEN_LOOKUP, QWEN_FINAL], grammar=None)
    await agent.run(SESSION, ARTICLE_QUESTION)
    assert [request.grammar for request in llm.requests] == [None, None]


async def test_the_first_step_policy_holds_a_course_question_to_a_course_lookup(db, registry):
    agent, llm = make_agent(db, registry, ["Thought: 我知道\nFinal Answer: 100节", QWEN_LOOKUP, QWEN_FINAL],
                            require_tool_call=True)
    result = await agent.run(SESSION, ARTICLE_QUESTION)

    assert "200" in result.answer
    first, reminded, after_lookup = (request.grammar.lark for request in llm.requests)
    assert "course_query" in first and "calculator" not in first and "Final Answer" not in first
    assert "Final Answer" not in reminded  # still no answer before a lookup
    assert "calculator" in after_lookup and "Final Answer" in after_lookup
    assert "Do not answer from memory" in llm.requests[1].last_content
    assert "[course_query]" in llm.requests[1].last_content
    assert [(s.kind, s.error) for s in result.steps] == [("format_error", "tool_required"), ("tool", None),
                                                         ("final", None)]


async def test_the_first_step_policy_leaves_other_questions_alone(db, registry):
    agent, llm = make_agent(db, registry, ["Thought: 好\nFinal Answer: 你好！"], require_tool_call=True)
    result = await agent.run(SESSION, "你好")
    assert result.answer == "你好！" and "Final Answer" in llm.requests[0].grammar.lark


async def test_a_model_that_keeps_answering_from_memory_gets_an_apology(db, registry):
    agent, _ = make_agent(db, registry, ["Thought: x\nFinal Answer: 100节", "Thought: x\nFinal Answer: 100节"],
                          require_tool_call=True)
    result = await agent.run(SESSION, ARTICLE_QUESTION)
    assert result.status == "gave_up" and "100" not in result.answer and result.answer.startswith("抱歉")


async def test_a_final_answer_that_loops_reaches_the_user_and_the_history_once(db, registry):
    looping = " 我知道了。\nFinal Answer: 200节。" + "I am sorry, " * 40 + "I am so"
    agent, _ = make_agent(db, registry, [QWEN_LOOKUP, looping])
    result = await agent.run(SESSION, ARTICLE_QUESTION)
    assert result.answer == "200节。I am sorry,"
    assert await history_rows(db) == [("user", ARTICLE_QUESTION), ("assistant", "200节。I am sorry,")]
