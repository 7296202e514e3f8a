"""Answers a team can trust, seen from the chat (fake Bot API): a looping answer never shows, streamed or not; a
number nothing supports becomes the honest answer in the user's language; a repeated call ends the search."""

from __future__ import annotations

from agent.apologies import APOLOGIES
from tests.fakes.telegram_bot import ALICE, CAROL, QWEN_LOOKUP, TEAM, private_chat, start_bot, telegram_server

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

STREAMING = {"token_seconds": 0.01, "stream_interval_seconds": 0.1, "group_stream_interval_seconds": 0.1}
LOOP = "1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1.1"


def answer(text: str) -> str:
    return f" I now know the final answer\nFinal Answer: {text}"


async def test_a_looping_answer_never_shows_in_a_group_streamed_by_edits(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, answer(f"200节。{LOOP}"), answer("200节。")], **STREAMING)
    telegram_server.send_text(TEAM, CAROL, "/ask 大模型技术实战有多少节课？")
    await bot.answers(TEAM.id, 1)
    await bot.turns_done()

    visible = telegram_server.visible_messages(TEAM.id)
    assert visible and all("1.1.1" not in text for text in visible), visible
    assert any("200" in text for text in visible)


async def test_a_looping_answer_never_shows_in_a_private_chat(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, answer(f"200节。{LOOP}"), answer("200节。")], **STREAMING)
    telegram_server.send_text(private_chat(ALICE), ALICE, "大模型技术实战有多少节课？")
    await bot.answers(ALICE.id, 1)
    await bot.turns_done()

    assert all("1.1.1" not in text for text in telegram_server.sent_texts(ALICE.id))
    assert all("1.1.1" not in text for text in telegram_server.visible_messages(ALICE.id))


async def test_an_ungrounded_number_twice_becomes_the_honest_answer_in_chinese(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, answer("一共500节课。"), answer("一共500节课。")], **STREAMING)
    telegram_server.send_text(private_chat(ALICE), ALICE, "大模型技术实战有多少节课？")
    await bot.answers(ALICE.id, 1)
    await bot.turns_done()

    assert telegram_server.visible_messages(ALICE.id) == [APOLOGIES["unconfirmed"]["zh"]]


async def test_an_ungrounded_number_twice_becomes_the_honest_answer_in_english(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, answer("It has 500 lessons."), answer("It has 500 lessons.")], **STREAMING)
    telegram_server.send_text(private_chat(ALICE), ALICE, "How many lessons does 大模型技术实战 have?")
    await bot.answers(ALICE.id, 1)
    await bot.turns_done()

    assert telegram_server.visible_messages(ALICE.id) == [APOLOGIES["unconfirmed"]["en"]]


async def test_a_repeated_call_ends_the_turn_with_a_final_answer(start_bot, telegram_server):
    again = " again\nAction: course_query\nAction Input: {\"course_name\": \"大模型技术实战\"}\nObservation:"
    bot = await start_bot([QWEN_LOOKUP, again, " 200节。"], **STREAMING)
    telegram_server.send_text(private_chat(ALICE), ALICE, "大模型技术实战有多少节课？")
    await bot.answers(ALICE.id, 1)
    await bot.turns_done()

    assert telegram_server.visible_messages(ALICE.id) == ["200节。"]
    assert await bot.query("SELECT kind FROM steps ORDER BY id") == [("tool",), ("repeated",), ("final",)]
