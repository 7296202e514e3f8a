"""A group upgraded to a supergroup (issue 13): Telegram gives it a new id and says so with `migrate_to_chat_id`
(in the old group) and `migrate_from_chat_id` (in the new one). Its access entry, its history and its tool
settings go with it, once, audited; before, the group was refused the next day and had lost its history.
"""

from __future__ import annotations

from tests.fakes.telegram_bot import ADMIN, CAROL, final, private_chat, start_bot, telegram_server
from tests.fakes.telegram_server import Chat, group_chat

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

OLD = Chat(-4001, "group", "Course team")  # a basic group: small negative id
NEW = group_chat(-1004001, "Course team")  # the supergroup it became


async def announce_upgrade(bot) -> None:
    """Both service messages, as Telegram sends them; returns once the bot has handled them (updates are handled
    concurrently, and a question sent at the same instant could be checked before the move commits)."""
    bot.server.push_message(OLD, CAROL, migrate_to_chat_id=NEW.id)
    bot.server.push_message(NEW, CAROL, migrate_from_chat_id=OLD.id)
    await bot.server.wait_for(lambda: not bot.server.pending_updates, 5, "the announcements to be fetched")
    await bot.all_handled()


async def test_an_allowed_group_keeps_its_access_history_and_tool_settings_as_a_supergroup(start_bot,
                                                                                           telegram_server):
    bot = await start_bot([final("first answer"), final("second answer")])
    assert (await bot.ask(private_chat(ADMIN), ADMIN, f"/allow {OLD.id}")).startswith("✅ chat -4001 is allowed")
    assert await bot.ask(OLD, CAROL, "@qwen_test_bot 第一个问题") == "first answer"
    assert (await bot.ask(OLD, ADMIN, "/tool_off calculator")).startswith("✅ calculator is off in this chat")

    await announce_upgrade(bot)
    assert await bot.ask(NEW, CAROL, "@qwen_test_bot 第二个问题") == "second answer"

    second_prompt = bot.llm.requests[1].text
    assert "第一个问题" in second_prompt and "first answer" in second_prompt  # the history came along
    assert "calculator" not in second_prompt  # so did the tool setting
    assert await bot.query("SELECT kind, subject_id, allowed, changed_by FROM access_list") == \
        [("chat", NEW.id, 1, ADMIN.id)]
    assert await bot.query("SELECT DISTINCT session_id FROM messages") == [(f"tg:{NEW.id}",)]
    assert await bot.query("SELECT session_id FROM turns") == [(f"tg:{NEW.id}",), (f"tg:{NEW.id}",)]
    assert await bot.query("SELECT id, chat_id, kind FROM sessions") == [(f"tg:{NEW.id}", NEW.id, "supergroup")]
    assert await bot.query("SELECT scope, tool_name, enabled FROM tool_settings") == \
        [(f"tg:{NEW.id}", "calculator", 0)]
    # Moved once, audited once: the second announcement found nothing left.
    assert await bot.query("SELECT user_id, chat_id, detail FROM audit_log WHERE action = 'chat_migrated'") == \
        [(None, NEW.id, f"chat {OLD.id} -> {NEW.id}: access allowed, 1 session(s), 1 tool setting(s)")]


async def test_a_group_allowed_by_the_environment_stays_allowed_as_a_supergroup(start_bot, telegram_server):
    bot = await start_bot([final("answer")], allowed_chat_ids=frozenset({OLD.id}))
    await announce_upgrade(bot)
    assert await bot.ask(NEW, CAROL, "@qwen_test_bot 问题") == "answer"
    assert await bot.query("SELECT kind, subject_id, allowed, changed_by FROM access_list") == \
        [("chat", NEW.id, 1, None)]


async def test_a_denied_group_stays_denied_as_a_supergroup(start_bot, telegram_server):
    bot = await start_bot([final("must not be used")], allowed_chat_ids=frozenset({OLD.id}))
    assert (await bot.ask(private_chat(ADMIN), ADMIN, f"/deny {OLD.id}")).startswith("✅ chat -4001 is denied")
    await announce_upgrade(bot)
    reply = await bot.ask(NEW, CAROL, "@qwen_test_bot 问题")
    assert "/allow" in reply and bot.llm.requests == []
    assert await bot.query("SELECT subject_id, allowed FROM access_list") == [(NEW.id, 0)]


async def test_an_upgrade_of_a_group_the_bot_knows_nothing_about_changes_nothing(start_bot, telegram_server):
    bot = await start_bot()
    await announce_upgrade(bot)
    await bot.all_handled()
    assert await bot.query("SELECT * FROM access_list") == []
    assert await bot.query("SELECT * FROM audit_log") == []
    assert telegram_server.sent() == []  # a service message gets no reply
