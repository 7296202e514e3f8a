"""Private chats against the fake Bot API server: questions, access, and the user commands."""

from __future__ import annotations

from tests.fakes.telegram_bot import (ADMIN, ALICE, ARTICLE_QUESTION, BOB, QWEN_FINAL, QWEN_LOOKUP, final,
                                      private_chat, start_bot, telegram_server)
from tests.fakes.telegram_server import User

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name


async def test_article_question_gets_one_reply_with_200_and_trace_shows_the_lookup(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL])
    chat = private_chat(ALICE)
    question_id = telegram_server.send_text(chat, ALICE, ARTICLE_QUESTION)

    answers = await bot.answers(ALICE.id, 1)
    assert len(answers) == 1 and "200" in answers[0]
    assert telegram_server.sent(ALICE.id)[0].params["reply_parameters"]["message_id"] == question_id

    trace = await bot.ask(chat, ALICE, "/trace")
    assert "🔧 course_query" in trace and "大模型技术实战" in trace and "200" in trace and " ms)" in trace
    rows = await bot.query("SELECT session_id, user_id, source_key, status FROM turns")
    assert rows == [(f"tg:{ALICE.id}", ALICE.id, bot.source_key(1), "answered")]
    history = await bot.query("SELECT role, content FROM messages ORDER BY id")
    assert history == [("user", ARTICLE_QUESTION), ("assistant", answers[0])]


async def test_unknown_user_gets_their_id_and_nothing_reaches_the_model(start_bot, telegram_server):
    bot = await start_bot([final("should never be used")])
    reply = await bot.ask(private_chat(BOB), BOB, "hello, what can you do?")

    assert str(BOB.id) in reply and "/allow" in reply
    assert bot.llm.requests == []
    assert await bot.query("SELECT count(*) FROM turns") == [(0,)]
    assert await bot.query("SELECT count(*) FROM messages") == [(0,)]


async def test_after_allow_from_an_admin_the_unknown_user_gets_answers(start_bot, telegram_server):
    bot = await start_bot([final("Hello Bob!")])
    refused = await bot.ask(private_chat(BOB), BOB, "hi")
    assert str(BOB.id) in refused

    confirmation = await bot.ask(private_chat(ADMIN), ADMIN, f"/allow {BOB.id}")
    assert "allowed" in confirmation
    assert await bot.ask(private_chat(BOB), BOB, "hi again") == "Hello Bob!"
    assert await bot.query("SELECT user_id, action, detail FROM audit_log") == [(ADMIN.id, "allow", f"user {BOB.id}")]

    await bot.ask(private_chat(ADMIN), ADMIN, f"/deny {BOB.id}")
    assert str(BOB.id) in await bot.ask(private_chat(BOB), BOB, "and now?")
    assert len(bot.llm.requests) == 1


async def test_start_speaks_the_users_language(start_bot, telegram_server):
    bot = await start_bot()
    chinese = await bot.ask(private_chat(ALICE), ALICE, "/start")
    english = await bot.ask(private_chat(ADMIN), ADMIN, "/start")

    assert "你好" in chinese and "/reset" in chinese
    assert english.startswith("Hi") and "/trace" in english
    stranger = await bot.ask(private_chat(BOB), BOB, "/start")
    assert str(BOB.id) in stranger  # /start tells a stranger how to get access


async def test_help_and_unknown_commands_show_the_commands(start_bot, telegram_server):
    bot = await start_bot()
    for command in ("/help", "/nonsense"):
        reply = await bot.ask(private_chat(ADMIN), ADMIN, command)
        assert "/cancel" in reply and "/trace" in reply
    assert bot.llm.requests == []


async def test_reset_forgets_the_history_the_model_sees(start_bot, telegram_server):
    bot = await start_bot([final("Noted: the codeword is PLUM."), final("No codeword known."),
                           final("Still nothing.")])
    chat = private_chat(ALICE)
    await bot.ask(chat, ALICE, "remember the codeword PLUM")
    await bot.ask(chat, ALICE, "what is the codeword?")
    assert "PLUM" in bot.llm.requests[-1].text  # the history reached the model

    assert "🧹" in await bot.ask(chat, ALICE, "/reset")
    await bot.ask(chat, ALICE, "what is the codeword now?")
    assert "PLUM" not in bot.llm.requests[-1].text
    assert await bot.query("SELECT count(*) FROM messages") == [(2,)]  # only the turn after /reset
    assert await bot.query("SELECT count(*) FROM turns") == [(3,)]  # traces stay


async def test_tools_lists_what_is_enabled_here(start_bot, telegram_server):
    bot = await start_bot()
    reply = await bot.ask(private_chat(ALICE), ALICE, "/tools")
    assert "course_query" in reply and "calculator" in reply
    assert "可用的工具" in reply  # Alice writes in Chinese


async def test_trace_before_any_turn_says_so(start_bot, telegram_server):
    bot = await start_bot()
    assert "还没有" in await bot.ask(private_chat(ALICE), ALICE, "/trace")


async def test_non_text_messages_get_a_text_only_reply(start_bot, telegram_server):
    bot = await start_bot()
    telegram_server.send_sticker(private_chat(ALICE), ALICE)
    assert "文字" in (await bot.answers(ALICE.id, 1))[0]
    assert bot.llm.requests == []


async def test_edited_messages_are_not_answered_twice(start_bot, telegram_server):
    bot = await start_bot([final("first answer"), final("second answer")])
    chat = private_chat(ALICE)
    question = telegram_server.send_text(chat, ALICE, "first question")
    await bot.answers(ALICE.id, 1)
    telegram_server.edit_text(chat, ALICE, question, "first question, edited")
    assert await bot.ask(chat, ALICE, "second question") == "second answer"
    await telegram_server.settle()

    assert telegram_server.sent_texts(ALICE.id) == ["first answer", "second answer"]
    assert len(bot.llm.requests) == 2


async def test_users_of_other_languages_get_english(start_bot, telegram_server):
    bot = await start_bot()
    pierre = User(ADMIN.id, "Pierre", "fr")
    assert (await bot.ask(private_chat(pierre), pierre, "/help")).startswith("Ask:")
