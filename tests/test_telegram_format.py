"""A model that breaks the ReAct format, on the fake Bot API: the user gets an honest apology, never the raw text."""

from __future__ import annotations

from tests.fakes.telegram_bot import ADMIN, ALICE, TEAM, private_chat, start_bot, telegram_server

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

# What SmolLM2-135M wrote for course questions: no Action, no Final Answer.
RAMBLING = ["I now know the answer\n\nEnd!", "Thought: I now know the answer"]


def sent_everywhere(server) -> list[str]:
    return [call.params.get("text", "") for call in server.calls_to("sendMessage")] + \
           [call.params.get("text", "") for call in server.calls_to("editMessageText")]


async def test_unparsable_output_twice_gets_an_apology_in_chinese_and_trace_says_why(start_bot, telegram_server):
    bot = await start_bot(RAMBLING)
    chat = private_chat(ALICE)

    reply = await bot.ask(chat, ALICE, "大模型技术实战课程一共多少节？")

    assert reply.startswith("抱歉") and "/trace" in reply
    assert not any(raw in text for raw in RAMBLING for text in sent_everywhere(telegram_server))
    trace = await bot.ask(chat, ALICE, "/trace")
    assert trace.count("format_error") == 2 and "no Action and no Final Answer" in trace
    assert await bot.query("SELECT status FROM turns") == [("gave_up",)]
    assert await bot.query("SELECT content FROM messages WHERE role = 'assistant'") == [(reply,)]


async def test_an_english_question_gets_the_apology_in_english(start_bot, telegram_server):
    bot = await start_bot(RAMBLING)
    reply = await bot.ask(private_chat(ADMIN), ADMIN, "How many lessons does the LLM course have?")
    assert reply.startswith("Sorry") and "/trace" in reply
    assert not any(raw in text for raw in RAMBLING for text in sent_everywhere(telegram_server))


async def test_in_a_group_too_the_raw_text_never_reaches_the_chat(start_bot, telegram_server):
    bot = await start_bot(["Action: The action to take", "The action to take", "Thought: The action to take"])
    reply = await bot.ask(TEAM, ALICE, "/ask 机器学习实战有几节课？")
    assert reply.startswith("抱歉") and "/trace" in reply
    assert not any("The action to take" in text for text in sent_everywhere(telegram_server))
    assert await bot.query("SELECT kind, error FROM steps ORDER BY position") == [
        ("tool", "unknown_tool"), ("format_error", "parse"), ("format_error", "parse")]
