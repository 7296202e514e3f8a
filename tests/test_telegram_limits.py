"""Telegram's limits and failures, and the bot's behaviour while it works: splitting, formatting fallback, failing
auxiliary calls, typing and progress, turn order, /cancel, and errors that end in an apology."""

from __future__ import annotations

import asyncio
import logging

from agent.errors import LLMError
from agent.llm.scripted import ScriptedLLM
from bot.telegram.replies import split_message, to_html, utf16_len
from tests.fakes.telegram_bot import (ADMIN, ALICE, ARTICLE_QUESTION, CAROL, QWEN_FINAL, QWEN_LOOKUP, TEAM, final,
                                      private_chat, start_bot, telegram_server)

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

# ~10,000 characters; every sentence numbered, so the answer is long without looping (agent/repetition.py)
DIGITS = "零一二三四五六七八九"


def chinese_numeral(n: int) -> str:
    """0 to 99 in Chinese numerals (十二, 四十九): an answer's numbers in words are not held to observations."""
    tens, ones = divmod(n, 10)
    return (DIGITS[tens] if tens > 1 else "") + ("十" if tens else "") + (DIGITS[ones] if ones or not tens else "")


# A long answer with no digits (a scripted text, not a lookup's numbers) and no loop: each sentence names its place.
LONG_ANSWER = "\n\n".join(
    f"第{chinese_numeral(i)}段：" + "".join(f"大模型技术实战课程的第{chinese_numeral(j)}节介绍。" for j in range(1, 13))
    for i in range(50))


# --- splitting and formatting, as functions -------------------------------------------------------------------

def test_split_prefers_paragraphs_then_lines_then_words():
    text = "a" * 50 + "\n\n" + "b" * 30 + "\n" + "c" * 30 + " " + "d" * 30
    assert split_message(text, limit=60) == ["a" * 50, "b" * 30, "c" * 30, "d" * 30]


def test_split_cuts_a_word_longer_than_the_limit_and_counts_utf16_units():
    assert split_message("x" * 25, limit=10) == ["x" * 10, "x" * 10, "x" * 5]
    emoji = "😀" * 10  # two UTF-16 units each
    pieces = split_message(emoji, limit=8)
    assert pieces == ["😀" * 4, "😀" * 4, "😀" * 2] and all(utf16_len(p) <= 8 for p in pieces)


def test_short_and_empty_texts():
    assert split_message("hello") == ["hello"]
    assert split_message("  \n ") == []


def test_markdown_becomes_telegram_html_and_plain_text_stays_plain():
    assert to_html("plain <text> & more") is None
    assert to_html("**bold** and `a<b`") == "<b>bold</b> and <code>a&lt;b</code>"
    assert to_html("```python\nx = 1 < 2\n```") == "<pre>x = 1 &lt; 2\n</pre>"
    assert to_html("**unclosed and `also") is None


# --- end to end ------------------------------------------------------------------------------------------------

async def test_a_10000_character_answer_arrives_as_several_messages_in_order(start_bot, telegram_server):
    assert 9_500 < len(LONG_ANSWER) < 10_500
    bot = await start_bot([final(LONG_ANSWER)])
    question = telegram_server.send_text(private_chat(ALICE), ALICE, "tell me everything")
    await bot.answers(ALICE.id, 3)
    await telegram_server.settle()

    sent = telegram_server.sent(ALICE.id)
    texts = [call.result["text"] for call in sent]
    assert len(texts) >= 3 and all(utf16_len(t) <= 4096 for t in texts)
    assert "\n\n".join(texts) == LONG_ANSWER  # cut at paragraph boundaries, nothing lost, in order
    assert sent[0].params["reply_parameters"]["message_id"] == question
    assert all("reply_parameters" not in call.params for call in sent[1:])
    assert telegram_server.calls_to("sendMessage", ok=False) == []


async def test_markdown_answers_are_formatted(start_bot, telegram_server):
    bot = await start_bot([QWEN_LOOKUP, final("The answer is **200** lessons (`course_query`).")])
    assert await bot.ask(private_chat(ALICE), ALICE, ARTICLE_QUESTION) == "The answer is 200 lessons (course_query)."
    assert telegram_server.sent(ALICE.id)[0].params["parse_mode"] == "HTML"


async def test_formatting_telegram_rejects_falls_back_to_plain_text(start_bot, telegram_server):
    telegram_server.fail("sendMessage", status=400, description="Bad Request: can't parse entities: nope",
                         when=lambda params: params.get("parse_mode") == "HTML", times=-1)
    bot = await start_bot([QWEN_LOOKUP, final("The answer is **200** lessons.")])
    assert await bot.ask(private_chat(ALICE), ALICE, ARTICLE_QUESTION) == "The answer is **200** lessons."
    assert len(telegram_server.calls_to("sendMessage", ok=False)) == 1


async def test_failing_chat_actions_and_command_menu_do_not_stop_the_answer(start_bot, telegram_server):
    telegram_server.fail("sendChatAction", status=500, times=-1)
    telegram_server.fail("setMyCommands", status=400, description="Bad Request: chat not found", times=-1)
    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL], delay=0.2, typing_interval_seconds=0.1)
    answer = await bot.ask(private_chat(ALICE), ALICE, ARTICLE_QUESTION)

    assert "200" in answer
    assert telegram_server.calls_to("sendChatAction") and not telegram_server.calls_to("sendChatAction", ok=True)
    assert telegram_server.calls_to("setMyCommands") and not telegram_server.calls_to("setMyCommands", ok=True)


async def test_command_menus_are_registered(start_bot, telegram_server):
    await start_bot()
    calls = telegram_server.calls_to("setMyCommands", ok=True)
    menus = {(call.params.get("language_code"), str(call.params.get("scope"))): call.params["commands"]
             for call in calls}
    default = menus[(None, "None")]
    assert {c["command"] for c in default} == {"ask", "help", "start", "reset", "cancel", "trace", "tools", "docs",
                                                "memory", "quota", "export"}
    admin_menus = [commands for (lang, scope), commands in menus.items() if "chat_id" in scope]
    assert len(admin_menus) == 1 and {"stats", "allow", "course_set", "doc_del"} <= {c["command"] for c in admin_menus[0]}
    assert len({c["command"] for c in admin_menus[0]}) == len(admin_menus[0])  # Telegram refuses a repeated command


async def test_typing_and_a_progress_message_that_shows_the_step_and_gives_way_to_the_answer(start_bot,
                                                                                                telegram_server):
    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL], delay=0.4, progress_after_seconds=0.1,
                          typing_interval_seconds=0.2)
    telegram_server.send_text(private_chat(ALICE), ALICE, ARTICLE_QUESTION)
    await bot.answers(ALICE.id, 2)
    await telegram_server.settle()

    progress, answer = telegram_server.sent_texts(ALICE.id)
    assert progress == "⏳ 正在思考…" and "200" in answer
    edits = [call.params["text"] for call in telegram_server.calls_to("editMessageText", ok=True)]
    assert edits == ["🔎 查询课程数据库: 大模型技术实战…"]
    assert len(telegram_server.calls_to("sendChatAction", ok=True)) >= 2
    assert telegram_server.calls_to("deleteMessage", ok=True)
    assert telegram_server.visible_messages(ALICE.id) == [answer]  # the progress message is gone


async def test_failing_progress_messages_do_not_lose_the_answer(start_bot, telegram_server):
    telegram_server.fail("editMessageText", status=500, times=-1)
    telegram_server.fail("deleteMessage", status=400, times=-1)
    bot = await start_bot([QWEN_LOOKUP, QWEN_FINAL], delay=0.3, progress_after_seconds=0.05)
    telegram_server.send_text(private_chat(ALICE), ALICE, ARTICLE_QUESTION)
    texts = await bot.answers(ALICE.id, 2)
    assert texts[0] == "⏳ 正在思考…" and "200" in texts[1]


async def test_a_second_message_waits_for_the_first_and_is_told_so(start_bot, telegram_server):
    bot = await start_bot([final("answer one"), final("answer two")], delay=0.3)
    chat = private_chat(ALICE)
    telegram_server.send_text(chat, ALICE, "question one")
    telegram_server.send_text(chat, ALICE, "question two")
    texts = await bot.answers(ALICE.id, 3)

    assert texts == ["⏳ 你的上一个问题还在处理中，这个问题会在它之后回答。", "answer one", "answer two"]
    assert "question one" in bot.llm.requests[1].text  # the second turn ran after the first was stored


def echo(request) -> str:
    """A model that answers "you asked about: <the question>", whatever order the calls come in (not the question
    alone: that would be the question echoed, which the safety nets turn back)."""
    return final("you asked about: " + request.last_content.rsplit("Question:", 1)[-1].strip())


class PrivateFirstLLM(ScriptedLLM):
    """Holds every call about "first" until a call about "in private" has begun: a bot that ran turns one at a
    time across chats would never finish the first one."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.private_began = asyncio.Event()

    async def complete(self, request):
        question = request.messages[-1]["content"]
        if "in private" in question:
            self.private_began.set()
        elif "first" in question:
            await self.private_began.wait()
        return await super().complete(request)


async def test_group_turns_run_in_order_and_other_chats_in_parallel(start_bot, telegram_server):
    bot = await start_bot(llm=PrivateFirstLLM([echo, echo, echo]))
    telegram_server.send_text(TEAM, CAROL, "/ask first")
    telegram_server.send_text(private_chat(ALICE), ALICE, "in private")
    telegram_server.send_text(TEAM, ADMIN, "/ask second")
    group = await bot.answers(TEAM.id, 2, timeout=10)

    assert group == ["you asked about: Carol: first", "you asked about: Ada: second"]  # the group's first turn ran beside the private one
    assert await bot.answers(ALICE.id, 1) == ["you asked about: in private"]
    second_group_prompt = [r.text for r in bot.llm.requests if "Ada: second" in r.last_content][0]
    assert "Carol: first" in second_group_prompt  # the group's second turn saw the first in its history


async def test_cancel_stops_a_long_generation_and_the_chat_can_ask_again_at_once(start_bot, telegram_server):
    bot = await start_bot([final("the answer")], delay=30)
    chat = private_chat(ALICE)
    telegram_server.send_text(chat, ALICE, "a question that takes forever")
    await telegram_server.wait_for(lambda: bot.llm.requests, message="the model to start")

    assert await bot.ask(chat, ALICE, "/cancel") == "⏹ 已停止。你可以重新提问。"
    bot.llm.delay = 0
    # Answered within `ask`'s wait, far shorter than the 30 s the stopped call would have taken.
    assert await bot.ask(chat, ALICE, "again") == "the answer"
    assert await bot.query("SELECT question, status FROM turns ORDER BY id") == [
        ("a question that takes forever", "cancelled"), ("again", "answered")]
    assert await bot.ask(chat, ALICE, "/cancel") == "现在没有正在进行的回答。"


async def test_model_failures_and_timeouts_get_a_short_apology(start_bot, telegram_server):
    bot = await start_bot([LLMError("backend exploded"), final("fine again")])
    chat = private_chat(ALICE)
    assert await bot.ask(chat, ALICE, "first") == "抱歉，模型暂时无法回答，请稍后再试。"
    assert await bot.ask(chat, ALICE, "second") == "fine again"


async def test_a_turn_past_its_time_limit_is_stopped_with_an_apology(start_bot, telegram_server):
    bot = await start_bot([final("too late")], delay=5, turn_timeout_seconds=0.3)
    assert "用时太长" in await bot.ask(private_chat(ALICE), ALICE, "slow question")


async def test_a_bug_in_our_code_is_logged_and_the_user_gets_an_apology_not_a_traceback(start_bot, telegram_server,
                                                                                          caplog):
    def broken(request):
        raise RuntimeError(f"bug while answering with token {telegram_server.token}")

    bot = await start_bot([broken, final("recovered")])
    with caplog.at_level(logging.ERROR):
        reply = await bot.ask(private_chat(ALICE), ALICE, "trigger the bug")
    assert reply == "抱歉，出了点问题，请稍后再试。"
    assert "Traceback" not in reply and "RuntimeError" not in reply
    assert "RuntimeError" in caplog.text  # logged, with its traceback, for the operator
    assert await bot.ask(private_chat(ALICE), ALICE, "next") == "recovered"


async def test_flood_wait_and_bad_gateway_on_send_are_retried_and_the_answer_arrives_once(start_bot,
                                                                                           telegram_server):
    telegram_server.fail("sendMessage", status=429, retry_after=1)
    telegram_server.fail("sendMessage", status=502)
    bot = await start_bot([final("delivered")])
    assert await bot.ask(private_chat(ALICE), ALICE, "hello") == "delivered"
    await telegram_server.settle()
    assert telegram_server.sent_texts(ALICE.id) == ["delivered"]
    assert [c.status for c in telegram_server.calls_to("sendMessage")] == [429, 502, 200]


async def test_the_long_poll_survives_server_errors(start_bot, telegram_server):
    bot = await start_bot([final("still here")])
    telegram_server.fail("getUpdates", status=502, times=2)
    await asyncio.sleep(0.1)
    assert await bot.ask(private_chat(ALICE), ALICE, "are you there?") == "still here"


async def test_in_a_group_cancel_stops_only_your_own_turn_unless_you_are_an_admin(start_bot, telegram_server):
    bot = await start_bot([final("never")], delay=30)
    telegram_server.send_text(TEAM, CAROL, "/ask a slow one")
    await telegram_server.wait_for(lambda: bot.llm.requests, message="the model to start")

    assert await bot.ask(TEAM, ALICE, "/cancel") == "现在没有正在进行的回答。"
    assert await bot.ask(TEAM, ADMIN, "/cancel") == "⏹ Stopped. You can ask again."
    await telegram_server.wait_for(lambda: not bot.application.bot_data["turns"].active)
    assert await bot.query("SELECT status FROM turns") == [("cancelled",)]
