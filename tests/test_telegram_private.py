"""Private chats against the fake Bot API server: questions, /trace, /start, /help, /reset, /tools, non-text."""

from __future__ import annotations

import json

from tests.fakes.telegram_bot import (ALICE, ARTICLE_QUESTION, QWEN_FINAL, QWEN_LOOKUP, final, private_chat,
                                      start_bot, telegram_server)

__all__ = ["start_bot", "telegram_server"]  # fixtures


async def test_article_question_gets_one_reply_with_200_and_trace_shows_the_lookup(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL])
    chat = private_chat(ALICE)
    question_id = telegram_server.send_text(chat, ALICE, ARTICLE_QUESTION)

    answers = await bot.answers(ALICE.id, 1)
    assert len(answers) == 1 and "200" in answers[0]
    assert telegram_server.sent(ALICE.id)[0].params["reply_parameters"]["message_id"] == question_id

    trace = await bot.ask(chat, ALICE, "/trace")
    assert "course_query" in trace and "大模型技术实战" in trace and "200" in trace and "ms" in trace
    rows = await bot.query("SELECT session_id, user_id, source_key, status FROM turns")
    assert rows == [(f"tg:{ALICE.id}", ALICE.id, "tg:update:1", "answered")]
