"""Memory that summarises, below Telegram: when a fold happens, what it folds, the language, a /reset meanwhile,
failures; the history the model sees (summary, window, last observations); the openai backend's background lane."""

from __future__ import annotations

import asyncio
import logging

import pytest

from agent.errors import LLMError
from agent.history import CUT_NOTE, cut_to_tokens, history_messages
from agent.llm.base import ModelRequest, Priority
from agent.llm.openai import OpenAILLM
from agent.llm.scripted import ScriptedLLM
from agent.loop import Agent, AgentLimits
from agent.memory import HistoryView, Memory, PastTurn, Session, Summary
from agent.steps import Step, StepKind
from agent.summaries import Summarizer, SummaryLimits, chat_language
from agent.tokens import estimate_tokens
from bot.program.texts import LANGUAGES, catalog
from tests.fakes.openai_server import FakeOpenAIServer, text
from tools.settings import ToolSettings

SESSION = Session(id="test:1", chat_key="test")


def turn(turn_id: int, question: str, answer: str = "ok") -> PastTurn:
    return PastTurn(turn_id, [{"role": "user", "content": question}, {"role": "assistant", "content": answer}])


def agent_with_summaries(db, registry, replies, *, budget: int, keep: int, background="a summary"):
    llm = ScriptedLLM(replies, background=background)
    memory = Memory(db)
    summarizer = Summarizer(llm, memory, budget, SummaryLimits(keep_tokens=keep))
    agent = Agent(llm, registry, ToolSettings(db, registry), memory, AgentLimits(history_token_budget=budget),
                  summarizer=summarizer)
    return agent, llm, summarizer


async def test_nothing_is_folded_while_the_history_fits(db, registry):
    agent, llm, summarizer = agent_with_summaries(db, registry, ["Final Answer: a", "Final Answer: b"],
                                                  budget=2000, keep=1000)
    await agent.run(SESSION, "one")
    await agent.run(SESSION, "two")
    await summarizer.idle()
    assert all(r.priority == Priority.NORMAL for r in llm.requests)
    assert await Memory(db).summary(SESSION.id) is None


async def test_the_oldest_turns_are_folded_until_what_is_left_fits_the_keep_limit(db, registry):
    words = " ".join(f"w{i}" for i in range(40))  # about 40 tokens a question
    agent, llm, summarizer = agent_with_summaries(
        db, registry, [f"Final Answer: answer {i}" for i in range(5)], budget=200, keep=100)
    for i in range(5):
        await agent.run(SESSION, f"question {i} {words}")
        await summarizer.idle()
    summary = await Memory(db).summary(SESSION.id)
    assert summary is not None and summary.text == "a summary" and summary.language == "en"
    background = [r for r in llm.requests if r.priority == Priority.LOW]
    assert "question 0" in background[0].text and "answer 0" in background[0].text
    assert "question 4" not in background[-1].text  # the newest turn is never folded
    view = await Memory(db).history_view(SESSION.id, llm.count_tokens, 200)
    assert view.summary == summary and view.turns and view.turns[0].turn_id > summary.through_turn_id


def test_the_turns_to_fold_leave_the_newest_whole_and_at_most_the_keep_limit():
    llm = ScriptedLLM(count_tokens=lambda text: len(text.split()))
    summarizer = Summarizer(llm, None, history_budget=10, limits=SummaryLimits(keep_tokens=4))
    turns = [turn(i, "a b c") for i in range(1, 5)]  # 4 tokens each (with the answer "ok")
    assert summarizer.turns_to_fold(turns[:2], None) == []  # 8 ≤ 10
    assert [t.turn_id for t in summarizer.turns_to_fold(turns, None)] == [1, 2, 3]
    previous = Summary("x y z", 0, 3, "en")
    assert [t.turn_id for t in summarizer.turns_to_fold(turns[:2], previous)] == [1]  # 8 + 3 > 10
    big = [turn(1, " ".join(["w"] * 50))]
    assert summarizer.turns_to_fold(big, None) == []  # one huge turn: never folded, the window drops it


@pytest.mark.parametrize("questions, expected", [
    (["大模型技术实战有多少节？", "那机器学习实战呢？"], "zh"),
    (["How many lessons?", "And per week?"], "en"),
    (["How many lessons?", "and hours?", "谢谢"], "en"),  # most are English
    (["hello", "你好"], "zh"),  # a tie: the newest question's
])
def test_the_summary_is_in_the_language_most_questions_are_in(questions, expected):
    assert chat_language([turn(i, q) for i, q in enumerate(questions, 1)]) == expected


async def test_a_reset_while_the_summary_is_written_wins(db, registry):
    memory = Memory(db)
    gate = asyncio.Event()
    agent, llm, summarizer = agent_with_summaries(db, registry, [f"Final Answer: {i}" for i in range(3)],
                                                  budget=30, keep=10)
    original = llm.complete

    async def held(request: ModelRequest):
        if request.priority == Priority.LOW:
            await gate.wait()
        return await original(request)

    llm.complete = held
    for i in range(3):
        await agent.run(SESSION, f"question {i} with enough words to pass the small budget")
    assert summarizer._running  # a summary waits on the gate
    await memory.reset(SESSION.id)
    gate.set()
    await summarizer.idle()
    assert await memory.summary(SESSION.id) is None  # the history it folded is gone: not stored


async def test_a_failing_summary_is_logged_and_the_turns_stay(db, registry, caplog):
    agent, llm, summarizer = agent_with_summaries(db, registry, [f"Final Answer: {i}" for i in range(3)],
                                                  budget=30, keep=10, background=LLMError("model down"))
    with caplog.at_level(logging.WARNING, logger="agent.summaries"):
        for i in range(3):
            await agent.run(SESSION, f"question {i} with enough words to pass the small budget")
            await summarizer.idle()
    assert "model down" in caplog.text
    assert await Memory(db).summary(SESSION.id) is None
    assert len(await Memory(db).turns_after(SESSION.id, 0)) == 3


async def test_close_stops_a_summary_in_progress(db, registry):
    agent, llm, summarizer = agent_with_summaries(db, registry, [f"Final Answer: {i}" for i in range(3)],
                                                  budget=30, keep=10)
    never = asyncio.Event()
    original = llm.complete

    async def stuck(request: ModelRequest):
        if request.priority == Priority.LOW:
            await never.wait()
        return await original(request)

    llm.complete = stuck
    for i in range(3):
        await agent.run(SESSION, f"question {i} with enough words to pass the small budget")
    assert summarizer._running
    await asyncio.wait_for(summarizer.close(), 5)
    assert not summarizer._running


# --- the history the model sees --------------------------------------------------------------------------------

LOOKUP = Step(1, StepKind.TOOL, "look it up", "course_query", '{"course_name": "x"}', '{"课时": 200, "每周更新次数": 3}')


def test_the_history_has_the_summary_first_and_the_last_turns_observations():
    view = HistoryView(Summary("earlier: greetings", 1, 1, "en"), [turn(2, "q2", "a2"), turn(3, "q3", "a3")])
    messages = history_messages(view, [LOOKUP], estimate_tokens, 300)
    assert messages[0]["role"] == "system" and messages[0]["content"].endswith("earlier: greetings")
    assert [m["content"] for m in messages[1:4]] == ["q2", "a2", "q3"]
    assert messages[4]["content"] == ('a3\n\n(What I looked up for this answer:\n'
                                      '- course_query {"course_name": "x"}: {"课时": 200, "每周更新次数": 3})')


def test_no_observations_are_kept_with_a_zero_limit():
    messages = history_messages(HistoryView(None, [turn(3, "q3", "a3")]), [LOOKUP], estimate_tokens, 0)
    assert messages[-1]["content"] == "a3"


def test_cut_to_tokens_keeps_the_longest_start_that_fits_with_its_note():
    count = lambda text: len(text)  # noqa: E731 - a character a token
    assert cut_to_tokens("short", count, 10) == "short"
    cut = cut_to_tokens("abcdefghijklmnopqrstuvwxyz", count, 12)
    assert cut == "abcde" + CUT_NOTE and len(cut) == 12


# --- the openai backend's background lane ----------------------------------------------------------------------

async def test_background_calls_take_one_server_slot_and_peoples_calls_do_not_wait_for_them():
    with FakeOpenAIServer() as server:
        server.add(*[text("summary", delay=0.5) for _ in range(3)], text("answer"))
        llm = OpenAILLM(base_url=server.base_url, model="fake-qwen", low_priority_concurrency=1)
        try:
            background = [asyncio.create_task(llm.complete(ModelRequest([{"role": "user", "content": f"s{i}"}],
                                                                        priority=Priority.LOW)))
                          for i in range(3)]
            await asyncio.sleep(0.2)
            person = await asyncio.wait_for(llm.complete(ModelRequest([{"role": "user", "content": "q"}])), 2)
            assert person.text in ("summary", "answer")
            assert not all(task.done() for task in background)  # the person's call did not queue behind them
            await asyncio.gather(*background)
        finally:
            await llm.close()
    assert server.max_in_flight == 2  # one background call, and the person's, never three background calls


# --- every text in both languages -------------------------------------------------------------------------------

def test_every_text_the_bot_says_has_a_chinese_and_an_english_variant():
    import bot.telegram.app  # noqa: F401 - imports every module that adds texts

    missing = [key for key, variants in catalog().items() if set(variants) != set(LANGUAGES)]
    assert missing == []
