"""Group chats: the bot answers only when addressed, ignores and never stores chatter, keeps one history per group
(per forum topic), and replies to the asker's message."""

from __future__ import annotations

from tests.fakes.telegram_bot import (ALICE, BOB, CAROL, STRANGERS, TEAM, final, private_chat, start_bot,
                                      telegram_server)
from tests.fakes.telegram_server import group_chat

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name


async def nothing_stored(bot) -> bool:
    counts = [await bot.query(f"SELECT count(*) FROM {table}") for table in ("turns", "messages", "sessions")]
    return counts == [[(0,)]] * 3


async def test_plain_group_messages_get_nothing_and_store_nothing(start_bot, telegram_server):
    bot = await start_bot([final("never")])
    telegram_server.send_text(TEAM, CAROL, "lunch at noon?")
    telegram_server.send_text(TEAM, ALICE, "大模型技术实战 has how many lessons, anyone?")
    telegram_server.send_text(TEAM, CAROL, "ask @someone_else about it")
    telegram_server.send_sticker(TEAM, CAROL)
    await telegram_server.wait_for(lambda: telegram_server.pending_updates == [] and bot.application.bot_data)
    await telegram_server.settle()

    assert telegram_server.sent(TEAM.id) == []
    assert telegram_server.calls_to("sendChatAction") == []
    assert bot.llm.requests == []
    assert await nothing_stored(bot)


async def test_mention_reply_and_ask_each_get_exactly_one_answer_replying_to_the_asker(start_bot, telegram_server):
    bot = await start_bot([final("answer one"), final("answer two"), final("answer three")])
    mention = telegram_server.send_text(TEAM, CAROL, "@qwen_test_bot how many lessons?")
    await bot.answers(TEAM.id, 1)
    bots_message = telegram_server.sent(TEAM.id)[0].result["message_id"]
    reply = telegram_server.send_text(TEAM, ALICE, "and per week?", reply_to=bots_message)
    await bot.answers(TEAM.id, 2)
    ask = telegram_server.send_text(TEAM, CAROL, "/ask what about hours?")
    await bot.answers(TEAM.id, 3)
    await telegram_server.settle()

    sent = telegram_server.sent(TEAM.id)
    assert [c.result["text"] for c in sent] == ["answer one", "answer two", "answer three"]
    assert [c.params["reply_parameters"]["message_id"] for c in sent] == [mention, reply, ask]


async def test_the_model_sees_who_asked_without_the_mention(start_bot, telegram_server):
    bot = await start_bot([final("ok"), final("ok")])
    await bot.ask(TEAM, CAROL, "@qwen_test_bot, how many lessons?")
    await bot.ask(TEAM, ALICE, "/ask@qwen_test_bot and hours?")

    first, second = bot.llm.requests[0].text, bot.llm.requests[1].text
    assert "Carol: how many lessons?" in first and "@qwen_test_bot" not in first
    assert "Alice: and hours?" in second
    assert "Carol: how many lessons?" in second  # one history for the whole group
    assert await bot.query("SELECT DISTINCT session_id FROM turns") == [(f"tg:{TEAM.id}",)]


async def test_commands_for_another_bot_are_ignored(start_bot, telegram_server):
    bot = await start_bot([final("never")])
    telegram_server.send_text(TEAM, CAROL, "/ask@other_bot what is this?")
    telegram_server.send_text(TEAM, CAROL, "/help@other_bot")
    await telegram_server.wait_for(lambda: telegram_server.pending_updates == [])
    await telegram_server.settle()
    assert telegram_server.sent(TEAM.id) == [] and bot.llm.requests == []


async def test_private_and_group_histories_never_mix(start_bot, telegram_server):
    bot = await start_bot([final("private noted"), final("group answer"), final("private again")])
    await bot.ask(private_chat(ALICE), ALICE, "my secret is MANGO")
    await bot.ask(TEAM, ALICE, "/ask what is my secret?")
    assert "MANGO" not in bot.llm.requests[1].text
    await bot.ask(private_chat(ALICE), ALICE, "what did the group ask?")
    assert "what is my secret" not in bot.llm.requests[2].text and "MANGO" in bot.llm.requests[2].text


async def test_forum_topics_have_their_own_history_and_answers_go_to_the_topic(start_bot, telegram_server):
    forum = group_chat(TEAM.id, "Team", forum=True)
    bot = await start_bot([final("noted in this topic"), final("nothing here")])
    await bot.ask(forum, ALICE, "/ask remember KIWI", thread_id=7)
    await bot.ask(forum, ALICE, "/ask anything to remember?", thread_id=9)

    assert "KIWI" not in bot.llm.requests[1].text
    assert [c.params.get("message_thread_id") for c in telegram_server.sent(TEAM.id)] == [7, 9]
    sessions = await bot.query("SELECT session_id FROM turns ORDER BY id")
    assert sessions == [(f"tg:{TEAM.id}:7",), (f"tg:{TEAM.id}:9",)]


async def test_a_stranger_in_a_group_that_is_not_allowed_gets_their_id(start_bot, telegram_server):
    bot = await start_bot([final("never")])
    reply = await bot.ask(STRANGERS, BOB, "/ask hello?")
    assert str(BOB.id) in reply
    assert bot.llm.requests == [] and await nothing_stored(bot)


async def test_an_allowed_user_may_ask_in_any_group(start_bot, telegram_server):
    bot = await start_bot([final("yes")])
    assert await bot.ask(STRANGERS, ALICE, "@qwen_test_bot may I?") == "yes"


async def test_ask_without_a_question_gets_the_usage(start_bot, telegram_server):
    bot = await start_bot()
    assert "/ask" in await bot.ask(TEAM, CAROL, "/ask")
    assert bot.llm.requests == []
