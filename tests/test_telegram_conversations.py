"""Conversations that last, on the fake Bot API: summaries, follow-ups, personas, quotas, export, replies in Chinese.

The model is scripted; its recorded requests show what it was given. Background (summary) calls are answered by the
scripted model's `background` reply, never from the turns' own script.
"""

from __future__ import annotations

import random
import string
from datetime import timedelta

import httpx
import pytest

from agent.llm.base import Priority
from agent.llm.scripted import Request
from agent.prompts import REACT_STOPS
from bot.telegram.quotas import utc_clock
from tests.fakes.telegram_bot import (ADMIN, ALICE, ARTICLE_QUESTION, QWEN_FINAL, QWEN_LOOKUP, final, lookup,
                                      private_chat, start_bot, telegram_server)
from tests.fakes.telegram_server import User

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

ZH_ADMIN = User(4004, "Wang", "zh-hans")
CHINESE_SUMMARY = "摘要：用户先后问了几个关于课程的问题，助手逐一回答了。"


def summarise(request: Request) -> str:
    """The scripted model's summary: in Chinese when asked for Chinese."""
    return CHINESE_SUMMARY if "Chinese" in request.text else "Summary: the user asked about courses."


def summary_message(request: Request) -> str | None:
    """The summary system message of a recorded request, if it holds one."""
    return next((m["content"] for m in request.messages[1:] if m["role"] == "system"), None)


# --- memory that summarises ------------------------------------------------------------------------------------

async def test_a_long_chats_summary_is_in_the_next_prompt_and_in_memory_and_reset_forgets_it(start_bot,
                                                                                              telegram_server):
    # Each question names a course: its model looks it up first (REQUIRE_TOOL_CALL, on by default).
    answers = [reply for i in range(6) for reply in (lookup("大模型技术实战"), final(f"第{i}个回答。"))]
    bot = await start_bot([*answers, final("还有机器学习实战。")], history_token_budget=100,
                          summary_keep_tokens=40)
    bot.llm.background = summarise
    chat = private_chat(ALICE)
    assert "还没有摘要" in await bot.ask(chat, ALICE, "/memory")
    for i in range(6):
        await bot.ask(chat, ALICE, f"第{i}个问题：大模型技术实战课程一共上线了多少节？")
        await bot.application.bot_data["services"].summarizer.idle()

    summaries = [r for r in bot.llm.requests if r.priority == Priority.LOW]
    assert summaries, "the history passed its budget: a summary was asked for"
    assert all(r.user_key == f"user:{ALICE.id}" for r in summaries)
    assert "Chinese (简体中文)" in summaries[0].text and "第0个问题" in summaries[0].text
    rows = await bot.query("SELECT summary, language, folded_turns FROM session_summaries")
    assert rows and rows[0][0] == CHINESE_SUMMARY and rows[0][1] == "zh" and rows[0][2] >= 2

    await bot.ask(chat, ALICE, "还有别的课程吗？")
    prompt = bot.llm.requests[-1]
    assert summary_message(prompt) is not None and CHINESE_SUMMARY in summary_message(prompt)
    assert "第0个问题" not in prompt.text  # folded into the summary, out of the window
    assert "第5个问题" in prompt.text  # the newest turns stay whole

    memory = await bot.ask(chat, ALICE, "/memory")
    assert CHINESE_SUMMARY in memory and "摘要" in memory
    await bot.ask(chat, ALICE, "/reset")
    assert await bot.query("SELECT * FROM session_summaries") == []
    assert "还没有摘要" in await bot.ask(chat, ALICE, "/memory")


async def test_a_short_chat_asks_for_no_summary(start_bot, telegram_server):
    bot = await start_bot([final("一"), final("二")])
    await bot.ask(private_chat(ALICE), ALICE, "你好")
    await bot.ask(private_chat(ALICE), ALICE, "再见")
    await bot.application.bot_data["services"].summarizer.idle()
    assert [r.priority for r in bot.llm.requests] == [Priority.NORMAL, Priority.NORMAL]
    assert summary_message(bot.llm.requests[-1]) is None


async def test_a_follow_up_uses_the_last_observation_without_a_new_lookup(start_bot, telegram_server):
    def from_memory(request: Request) -> str:
        # A model that answers from what it sees, and looks the course up only when it does not see it.
        if '"每周更新次数": 3' in request.text:
            return final("大模型技术实战每周更新3次，每次2小时，也就是每周6小时。")
        return QWEN_LOOKUP

    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL, from_memory])
    chat = private_chat(ALICE)
    assert "200" in await bot.ask(chat, ALICE, ARTICLE_QUESTION)
    answer = await bot.ask(chat, ALICE, "那它每周要花多少小时？")
    assert answer == "大模型技术实战每周更新3次，每次2小时，也就是每周6小时。"
    assert len(bot.llm.requests) == 3  # lookup, answer, then the follow-up answered at once
    last_turn = (await bot.query("SELECT max(id) FROM turns"))[0][0]
    assert await bot.query("SELECT kind FROM steps WHERE turn_id = ?", (last_turn,)) == [("final",)]
    # The last turn is in the prompt with its answer, then what its tool returned.
    history = bot.llm.requests[2].messages[-2]["content"]
    assert history.startswith("大模型技术实战课程目前一共上线了200节课。\n\n(What I looked up for this answer:\n"
                              '- course_query {"course_name": "大模型技术实战"}: {"课程名称": "大模型技术实战"')


async def test_the_last_observation_is_cut_to_its_token_limit(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL, final("好")], last_observations_tokens=8)
    await bot.ask(private_chat(ALICE), ALICE, ARTICLE_QUESTION)
    await bot.ask(private_chat(ALICE), ALICE, "谢谢")
    history = bot.llm.requests[2].messages[-2]["content"]
    assert "… [cut]" in history and '"每次更新小时"' not in history


# --- personas --------------------------------------------------------------------------------------------------

async def test_a_persona_changes_the_prompt_and_not_the_format(start_bot, telegram_server):
    bot = await start_bot([final("a"), final("b"), final("c")])
    chat = private_chat(ADMIN)
    await bot.ask(chat, ADMIN, "hello")
    plain = bot.llm.requests[-1]

    assert "persona is now" in await bot.ask(chat, ADMIN, "/persona You are Xiaoming. Answer in one sentence.")
    await bot.ask(chat, ADMIN, "hello again")
    with_persona = bot.llm.requests[-1]
    system = with_persona.messages[0]["content"]
    assert "You are Xiaoming. Answer in one sentence." in system
    own_line, instructions = plain.messages[0]["content"].split("\n\n", 1)
    assert system.startswith(own_line) and system.endswith(instructions)  # the ReAct format and tools, as they were
    assert "Use the following format:" in instructions and "Final Answer:" in instructions
    assert with_persona.stop == plain.stop == REACT_STOPS  # the same stop words
    assert with_persona.grammar == plain.grammar
    assert "Xiaoming" in await bot.ask(chat, ADMIN, "/help")
    assert "Xiaoming" not in await bot.ask(private_chat(ALICE), ALICE, "/help")  # another chat: none

    assert "back to the default" in await bot.ask(chat, ADMIN, "/persona reset")
    await bot.ask(chat, ADMIN, "and again")
    assert bot.llm.requests[-1].messages[0]["content"] == plain.messages[0]["content"]
    assert [row[0] for row in await bot.query("SELECT detail FROM audit_log WHERE action = 'persona'")] == [
        f"scope=tg:{ADMIN.id} You are Xiaoming. Answer in one sentence.", f"scope=tg:{ADMIN.id} reset"]


async def test_the_default_persona_applies_where_a_chat_has_none_and_a_long_one_is_refused(start_bot,
                                                                                           telegram_server):
    bot = await start_bot([final("a")], default_persona="Be cheerful.", persona_max_chars=20)
    await bot.ask(private_chat(ALICE), ALICE, "hi")
    assert "Be cheerful." in bot.llm.requests[-1].messages[0]["content"]
    refusal = await bot.ask(private_chat(ADMIN), ADMIN, "/persona " + "x" * 21)
    assert "too long" in refusal and "21" in refusal
    assert await bot.query("SELECT * FROM chat_options") == []


# --- quotas ----------------------------------------------------------------------------------------------------

async def test_a_quota_refusal_says_when_once_and_the_next_day_resets_it(start_bot, telegram_server):
    bot = await start_bot([final(f"answer {letter}") for letter in "abcdef"], user_daily_turns=2)
    quotas = bot.application.bot_data["quotas"]
    today = utc_clock()
    quotas.clock = lambda: today
    chat = private_chat(ALICE)
    await bot.ask(chat, ALICE, "one")
    assert "还剩 1" in await bot.ask(chat, ALICE, "/quota")
    await bot.ask(chat, ALICE, "two")
    refusal = await bot.ask(chat, ALICE, "three")
    assert refusal.startswith("⛔ 你今天的 2 个问题额度已经用完。额度在 UTC 00:00 重置（") and "小时" in refusal
    sent = len(telegram_server.sent_texts(ALICE.id))
    telegram_server.send_text(chat, ALICE, "four")  # told once a day: this one is dropped quietly
    await bot.turns_done()
    assert len(telegram_server.sent_texts(ALICE.id)) == sent
    assert len(bot.llm.requests) == 2
    await bot.ask(private_chat(ADMIN), ADMIN, "admins are exempt")
    await bot.ask(private_chat(ADMIN), ADMIN, "twice")
    assert "no limit applies to you" in await bot.ask(private_chat(ADMIN), ADMIN, "/quota")

    quotas.clock = lambda: today + timedelta(days=1)  # the next day, without sleeping
    assert await bot.ask(chat, ALICE, "five") == "answer e"
    assert [row[0] for row in await bot.query("SELECT question FROM turns ORDER BY id")] == [
        "one", "two", "admins are exempt", "twice", "five"]


async def test_quota_set_gives_a_user_their_own_limit_audited(start_bot, telegram_server):
    bot = await start_bot([final("a"), final("b")], user_daily_tokens=1_000_000)
    done = await bot.ask(private_chat(ADMIN), ADMIN, f"/quota_set {ALICE.id} tokens 1")
    assert done == f"✅ User {ALICE.id}'s daily tokens limit: 1."
    await bot.ask(private_chat(ALICE), ALICE, "first")  # answered: nothing was used before it
    refusal = await bot.ask(private_chat(ALICE), ALICE, "second")
    assert "token 额度已经用完" in refusal
    assert "Usage" in await bot.ask(private_chat(ADMIN), ADMIN, f"/quota_set {ALICE.id} tokens lots")
    back = await bot.ask(private_chat(ADMIN), ADMIN, f"/quota_set {ALICE.id} tokens default")
    assert "back to the setting (1000000)" in back
    assert await bot.query("SELECT action, detail FROM audit_log") == [
        ("quota_set", f"user {ALICE.id} tokens=1"), ("quota_set", f"user {ALICE.id} tokens=default")]


# --- export ----------------------------------------------------------------------------------------------------

def download(server, document) -> bytes:
    """The document's bytes, fetched as a client would: getFile, then the file's URL."""
    answer = httpx.post(f"{server.base_url}{server.token}/getFile", data={"file_id": document.file_id}).json()
    return httpx.get(server.file_url(answer["result"]["file_path"])).content


async def test_export_sends_the_history_as_a_markdown_document(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL, final("不客气。")])
    chat = private_chat(ALICE)
    await bot.ask(chat, ALICE, ARTICLE_QUESTION)
    await bot.ask(chat, ALICE, "谢谢")
    telegram_server.send_text(chat, ALICE, "/export")
    (document,) = await telegram_server.wait_for(lambda: telegram_server.documents(ALICE.id))
    assert document.file_name.startswith(f"chat-{ALICE.id}-") and document.file_name.endswith(".md")
    assert document.caption == "📄 本聊天的记录：2 轮问答。"
    markdown = download(telegram_server, document).decode("utf-8")
    assert markdown == document.data.decode("utf-8")
    started = (await bot.query("SELECT started_at FROM turns ORDER BY id"))[0][0]
    assert markdown.startswith("# 聊天记录：")
    assert f"## 1 · {started[:19].replace('T', ' ')}（UTC" in markdown
    assert f"> {ARTICLE_QUESTION}" in markdown and "大模型技术实战课程目前一共上线了200节课。" in markdown
    assert "> 谢谢" in markdown and "不客气。" in markdown
    assert "course_query" not in markdown  # steps are for admins


async def test_an_admins_export_has_the_steps_and_a_long_history_is_cut_with_a_note(start_bot, telegram_server):
    # 300 characters of letters that neither loop nor repeat (the answer's garbage cut would shorten "x" * 300).
    letters = random.Random(0).choices(string.ascii_lowercase + " ", k=6 * 300)
    filler = ["".join(letters[i * 300:(i + 1) * 300]) for i in range(6)]
    replies = [QWEN_LOOKUP, QWEN_FINAL] + [final(f"Answer number {i}. {filler[i]}") for i in range(6)]
    bot = await start_bot(replies, export_max_bytes=2000)
    chat = private_chat(ADMIN)
    await bot.ask(chat, ADMIN, ARTICLE_QUESTION)
    for i in range(6):
        await bot.ask(chat, ADMIN, f"question {i}")
    telegram_server.send_text(chat, ADMIN, "/export")
    (document,) = await telegram_server.wait_for(lambda: telegram_server.documents(ADMIN.id))
    markdown = download(telegram_server, document).decode("utf-8")
    assert len(document.data) <= 2000
    assert "oldest" in markdown and "left out" in markdown and "the limit is 2000 bytes" in markdown
    assert "question 5" in markdown and ARTICLE_QUESTION not in markdown  # the newest kept
    assert "did not fit the size limit" in document.caption


async def test_admin_export_shows_steps(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL])
    await bot.ask(private_chat(ADMIN), ADMIN, ARTICLE_QUESTION)
    telegram_server.send_text(private_chat(ADMIN), ADMIN, "/export")
    (document,) = await telegram_server.wait_for(lambda: telegram_server.documents(ADMIN.id))
    markdown = document.data.decode("utf-8")
    assert "Steps:" in markdown and "Action: course_query" in markdown and '"课时": 200' in markdown


async def test_export_of_an_empty_chat_says_so(start_bot, telegram_server):
    bot = await start_bot()
    assert await bot.ask(private_chat(ALICE), ALICE, "/export") == "本聊天还没有可以导出的记录。"
    assert telegram_server.documents() == []


# --- replies in the user's language ----------------------------------------------------------------------------

@pytest.mark.parametrize("command, chinese", [
    ("/stats", "📊 最近 7 天没有问答。"),
    ("/courses", "• 大模型技术实战：课时 200，每周更新 3 次，每次 2 小时"),
    ("/mcp_list", "还没有 MCP 服务器。"),
    ("/allow 2002", "✅ 已允许用户 2002。"),
    ("/tool_off calculator", "✅ 已在本聊天停用 calculator。"),
    ("/course_del", "用法：/course_del 名称"),
    ("/quota_set 1001 turns 3", "✅ 用户 1001 每天的问题数上限：3。"),
])
async def test_an_admin_command_replies_in_chinese_to_a_chinese_admin(start_bot, telegram_server, command, chinese):
    bot = await start_bot(admin_user_ids=frozenset({ADMIN.id, ZH_ADMIN.id}))
    reply = await bot.ask(private_chat(ZH_ADMIN), ZH_ADMIN, command)
    assert reply.startswith(chinese) if command == "/courses" else reply == chinese


async def test_stats_are_in_chinese_for_a_chinese_admin_and_english_for_an_english_one(start_bot, telegram_server):
    bot = await start_bot([final("好")], admin_user_ids=frozenset({ADMIN.id, ZH_ADMIN.id}))
    await bot.ask(private_chat(ALICE), ALICE, "你好")
    chinese = await bot.ask(private_chat(ZH_ADMIN), ZH_ADMIN, "/stats")
    assert chinese.startswith("📊 最近 7 天\n合计：问答 1 · 工具调用 0 · 错误 0 · 中位耗时")
    assert "按天：" in chinese and "按聊天：" in chinese
    english = await bot.ask(private_chat(ADMIN), ADMIN, "/stats")
    assert english.startswith("📊 Last 7 days\nTotal: turns 1 · tool calls 0 · errors 0 · median")
