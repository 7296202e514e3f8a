"""Admin commands: refused for everyone else (changing nothing), effective for admins, every change audited."""

from __future__ import annotations

import pytest

from tests.fakes.telegram_bot import (ADMIN, ALICE, CAROL, QWEN_FINAL, QWEN_LOOKUP, TEAM, final, private_chat,
                                      start_bot, telegram_server)

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

ADMIN_COMMANDS = ["/tool_on calculator", "/tool_off course_query", "/tool_off course_query global", "/tools all",
                  "/courses", "/course_add 强化学习实战 120 2 1.5", "/course_set 大模型技术实战 lessons 999",
                  "/course_del 大模型技术实战", "/allow 2002", "/deny 1001", "/admins", "/stats",
                  "/require_tool on", "/require_tool off global", "/persona 你是小明", "/persona reset",
                  "/quota_set 1001 turns 5"]


async def database_state(bot) -> list:
    return [await bot.query(sql) for sql in (
        "SELECT * FROM tool_settings", "SELECT * FROM chat_options", "SELECT name, lessons FROM courses ORDER BY id",
        "SELECT kind, subject_id, allowed FROM access_list", "SELECT * FROM audit_log", "SELECT * FROM user_quotas")]


async def test_every_admin_command_is_refused_for_others_and_changes_nothing(start_bot, telegram_server):
    bot = await start_bot()
    before = await database_state(bot)
    for command in ADMIN_COMMANDS:
        reply = await bot.ask(private_chat(ALICE), ALICE, command)  # Alice writes Chinese: so is her refusal
        assert reply == "⛔ 这个命令只有管理员可以用。", command
    assert await bot.ask(TEAM, CAROL, "/course_del@qwen_test_bot 大模型技术实战") == \
        "⛔ This command is for admins only."
    assert await database_state(bot) == before


async def test_tool_off_removes_the_tool_from_the_next_prompt_in_that_chat_only(start_bot, telegram_server):
    bot = await start_bot([final("one"), final("two"), final("three")])
    admin_chat = private_chat(ADMIN)
    await bot.ask(admin_chat, ADMIN, "first question")
    assert "course_query" in bot.llm.requests[-1].text

    assert "off in this chat" in await bot.ask(admin_chat, ADMIN, "/tool_off course_query")
    await bot.ask(admin_chat, ADMIN, "second question")
    assert "course_query" not in bot.llm.requests[-1].text and "calculator" in bot.llm.requests[-1].text
    await bot.ask(private_chat(ALICE), ALICE, "elsewhere")
    assert "course_query" in bot.llm.requests[-1].text  # other chats keep it

    audit = await bot.query("SELECT user_id, chat_id, action, detail FROM audit_log")
    assert audit == [(ADMIN.id, ADMIN.id, "tool_off", f"course_query scope=tg:{ADMIN.id}")]


async def test_tool_settings_global_and_back_on(start_bot, telegram_server):
    bot = await start_bot([final("a"), final("b")])
    await bot.ask(private_chat(ADMIN), ADMIN, "/tool_off calculator global")
    await bot.ask(private_chat(ALICE), ALICE, "question")
    assert "calculator" not in bot.llm.requests[-1].text
    listing = await bot.ask(private_chat(ADMIN), ADMIN, "/tools all")
    assert "⛔ calculator" in listing and "(global)" in listing and "✅ course_query" in listing

    await bot.ask(private_chat(ADMIN), ADMIN, "/tool_on calculator global")
    await bot.ask(private_chat(ALICE), ALICE, "question")
    assert "calculator" in bot.llm.requests[-1].text
    assert [row[0] for row in await bot.query("SELECT action FROM audit_log ORDER BY id")] == ["tool_off", "tool_on"]


async def test_course_set_changes_what_the_next_lookup_returns(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL, QWEN_LOOKUP, final("现在是210节。")])
    chat = private_chat(ADMIN)
    await bot.ask(chat, ADMIN, "大模型技术实战多少节？")
    assert '"课时": 200' in bot.llm.requests[1].text

    assert "lessons = 210" in await bot.ask(chat, ADMIN, "/course_set 大模型技术实战 lessons 210")
    await bot.ask(chat, ADMIN, "再查一次")
    assert '"课时": 210' in bot.llm.requests[3].text
    assert await bot.query("SELECT action, detail FROM audit_log") == [("course_set", "大模型技术实战 lessons=210")]


async def test_course_add_list_and_delete_are_audited(start_bot, telegram_server):
    bot = await start_bot()
    chat = private_chat(ADMIN)
    assert "Added 强化学习 实战" in await bot.ask(chat, ADMIN, "/course_add 强化学习 实战 120 2 1.5")
    assert "强化学习 实战: lessons 120, updates_per_week 2, hours_per_update 1.5" in await bot.ask(chat, ADMIN,
                                                                                                  "/courses")
    assert "hours_per_update = 2.5" in await bot.ask(chat, ADMIN, "/course_set 强化学习 实战 每次更新小时 2.5")
    assert "Removed" in await bot.ask(chat, ADMIN, "/course_del 强化学习 实战")
    assert await bot.query("SELECT count(*) FROM courses WHERE name LIKE '强化%'") == [(0,)]
    actions = await bot.query("SELECT action, detail FROM audit_log ORDER BY id")
    assert actions == [("course_add", "强化学习 实战 lessons=120 updates_per_week=2 hours_per_update=1.5"),
                       ("course_set", "强化学习 实战 hours_per_update=2.5"), ("course_del", "强化学习 实战")]


@pytest.mark.parametrize("command, expected", [
    ("/tool_off", "Usage: /tool_off NAME [global]"),
    ("/tool_on calculator everywhere", "Usage: /tool_on NAME [global]"),
    ("/tool_on no_such_tool", "No tool named 'no_such_tool'"),
    ("/course_add 强化学习实战 120", "Usage: /course_add"),
    ("/course_add 强化学习实战 -5 1 1", "lessons must be between 0 and"),
    ("/course_add 强化学习实战 many 1 1", "lessons must be a whole number"),
    ("/course_add 大模型技术实战 1 1 1", "already exists"),
    ("/course_set 大模型技术实战 lessons", "Usage: /course_set"),
    ("/course_set 大模型技术实战 price 10", "unknown field 'price'"),
    ("/course_set 没有这门课 lessons 10", "no course named"),
    ("/course_del", "Usage: /course_del NAME"),
    ("/course_del 没有这门课", "no course named"),
    ("/allow", "Usage: /allow ID"),
    ("/allow bob", "Usage: /allow ID"),
    ("/allow 0", "Usage: /allow ID"),
    ("/deny 12 34", "Usage: /deny ID"),
    ("/stats forever", "Usage: /stats"),
    ("/stats 0", "Usage: /stats"),
])
async def test_wrong_arguments_get_the_usage_line_and_change_nothing(start_bot, telegram_server, command, expected):
    bot = await start_bot()
    before = await database_state(bot)
    reply = await bot.ask(private_chat(ADMIN), ADMIN, command)
    assert expected in reply and "Traceback" not in reply
    assert await database_state(bot) == before


async def test_allow_a_group_lets_everyone_in_it_ask(start_bot, telegram_server):
    from tests.fakes.telegram_bot import BOB, STRANGERS

    bot = await start_bot([final("welcome")])
    assert str(BOB.id) in await bot.ask(STRANGERS, BOB, "/ask hi")
    assert "chat -1001000000002 is allowed" in await bot.ask(private_chat(ADMIN), ADMIN, f"/allow {STRANGERS.id}")
    assert await bot.ask(STRANGERS, BOB, "/ask hi") == "welcome"
    assert await bot.query("SELECT kind, subject_id, allowed, changed_by FROM access_list") == \
        [("chat", STRANGERS.id, 1, ADMIN.id)]


async def test_deny_overrides_the_environment(start_bot, telegram_server):
    bot = await start_bot()
    await bot.ask(private_chat(ADMIN), ADMIN, f"/deny {ALICE.id}")
    assert str(ALICE.id) in await bot.ask(private_chat(ALICE), ALICE, "hello?")
    listing = await bot.ask(private_chat(ADMIN), ADMIN, "/admins")
    assert f"Admins (ADMIN_USER_IDS): {ADMIN.id}" in listing and f"user {ALICE.id}: denied by {ADMIN.id}" in listing


async def test_stats_counts_turns_tool_calls_errors_and_median_latency(start_bot, telegram_server):
    from agent.errors import LLMError

    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL, final("plain"), LLMError("backend down")])
    await bot.ask(private_chat(ALICE), ALICE, "大模型技术实战多少节？")
    await bot.ask(private_chat(ADMIN), ADMIN, "hello")
    apology = await bot.ask(private_chat(ADMIN), ADMIN, "and now?")
    assert "Sorry" in apology

    report = await bot.ask(private_chat(ADMIN), ADMIN, "/stats")
    lines = report.splitlines()
    assert lines[0] == "📊 Last 7 days"
    assert lines[1].startswith("Total: turns 3 · tool calls 1 · errors 1 · median ")
    assert any(line.startswith(f"Alice ({ALICE.id}): turns 1 · tool calls 1 · errors 0") for line in lines)
    assert any(line.startswith(f"Ada ({ADMIN.id}): turns 2 · tool calls 0 · errors 1") for line in lines)
    day = (await bot.query("SELECT substr(started_at, 1, 10) FROM turns LIMIT 1"))[0][0]
    assert any(line.startswith(f"{day}: turns 3") for line in lines)


async def test_stats_with_no_turns(start_bot, telegram_server):
    bot = await start_bot()
    assert await bot.ask(private_chat(ADMIN), ADMIN, "/stats 30") == "📊 No turns in the last 30 days."


async def test_the_model_is_never_offered_a_tool_that_changes_data(start_bot, telegram_server):
    bot = await start_bot([final("ok")])
    await bot.ask(private_chat(ADMIN), ADMIN, "请把大模型技术实战的课时改成 0，然后删除所有课程")
    prompt = bot.llm.requests[0].text
    assert all(name in prompt for name in ("course_query", "course_list", "calculator"))
    offered = [tool for tool in bot.application.bot_data["services"].registry]
    assert sorted(tool.name for tool in offered) == ["calculator", "course_list", "course_query", "docs_read",
                                                     "docs_search"]
    assert all(tool.read_only for tool in offered)
    assert await bot.query("SELECT lessons FROM courses WHERE name = '大模型技术实战'") == [(200,)]


async def test_require_tool_makes_a_course_question_look_it_up_before_answering(start_bot, telegram_server):
    from_memory = final("这门课有很多节。")  # no number: an answer from memory the grounding net would not catch
    bot = await start_bot([from_memory, from_memory, QWEN_LOOKUP, QWEN_FINAL, final("你好！")])
    chat = private_chat(ALICE)
    assert "may answer without a tool (chat setting)" in await bot.ask(
        private_chat(ADMIN), ADMIN, "/require_tool off")  # the admin's own chat only
    await bot.ask(private_chat(ADMIN), ADMIN, "/require_tool off global")
    assert await bot.ask(chat, ALICE, "大模型技术实战课程一共多少节？") == "这门课有很多节。"  # off everywhere

    await bot.ask(private_chat(ADMIN), ADMIN, "/require_tool default global")  # on, the default
    answer = await bot.ask(chat, ALICE, "大模型技术实战课程一共多少节？")

    assert "200" in answer
    assert "Do not answer from memory" in bot.llm.requests[2].last_content  # the answer from memory was sent back
    trace = await bot.ask(chat, ALICE, "/trace")
    assert "format_error" in trace and "🔧 course_query" in trace
    assert await bot.ask(chat, ALICE, "你好") == "你好！"  # a question about no tool's subject: answered directly
    audit = await bot.query("SELECT action, detail FROM audit_log")
    assert audit == [("require_tool", f"off scope=tg:{ADMIN.id}"), ("require_tool", "off scope=global"),
                     ("require_tool", "default scope=global")]


async def test_require_tool_usage_and_default(start_bot, telegram_server):
    bot = await start_bot()
    admin_chat = private_chat(ADMIN)
    assert (await bot.ask(admin_chat, ADMIN, "/require_tool maybe")).startswith("Usage: /require_tool on|off|default")
    assert "(chat setting)" in await bot.ask(admin_chat, ADMIN, "/require_tool off")
    assert "must call a tool before answering (default setting)" in await bot.ask(admin_chat, ADMIN,
                                                                                   "/require_tool default")
    assert await bot.query("SELECT * FROM chat_options") == []
