"""Text on its way in and out (issue 13): the journal stores an update's JSON as written, not `\\uXXXX`-escaped
twice over; a lone surrogate (`\\ud800`), which no UTF-8 encoder takes, is replaced before anything leaves the
process: the model server's request, a Telegram message, an SQLite row.

Everything runs through the real bot against the fake Bot API server; the model is the fake OpenAI server behind
the real `openai` backend, where the surrogate used to break the request's encoding.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from telegram import Bot

from agent.llm.openai import OpenAILLM
from bot.telegram.replies import send_text
from tests.fakes.openai_server import FakeOpenAIServer, Reply, text
from tests.fakes.telegram_bot import ALICE, final, lookup, private_chat, running_bot, start_bot, telegram_server

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

ROOT = Path(__file__).resolve().parent.parent
CHAT = private_chat(ALICE)
LONE = "\ud800"
SHOWN = "\ufffd"  # U+FFFD, the replacement character


def _journaled(bot) -> str | None:
    """The one journaled update's payload, read through a second connection."""
    with sqlite3.connect(bot.settings.storage.database_path) as conn:
        row = conn.execute("SELECT payload FROM telegram_updates").fetchone()
    return row[0] if row else None


def errors_logged(caplog) -> list[str]:
    """Log records at ERROR or above (a failed handler logs one)."""
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]


async def test_the_journal_stores_an_update_as_readable_utf8_json_not_escaped_twice(start_bot, telegram_server):
    question = ('请帮我查一下："大模型技术实战" \\ 的课时？' * 60).strip()  # 1,380 characters, quotes and backslashes
    bot = await start_bot([lookup("大模型技术实战"), final("200")], delay=1.0)
    telegram_server.send_text(CHAT, ALICE, question)
    # Read while the turn runs: a handled update leaves only its husk (bot/telegram/journal_payloads.py).
    payload = await telegram_server.wait_for(lambda: _journaled(bot), 5, "the update in the journal")
    assert await bot.answers(ALICE.id, 1) == ["200"]
    assert json.loads(payload)["message"]["text"] == question
    assert "大模型技术实战" in payload and "\\u" not in payload
    # UTF-8 as written: about the question's own size, where \uXXXX escapes took twice as much for Chinese text.
    assert len(payload.encode("utf-8")) < len(question.encode("utf-8")) * 1.1 + 1000


async def test_a_lone_surrogate_in_a_question_reaches_the_model_server_and_the_store_replaced(telegram_server,
                                                                                              tmp_path, caplog):
    with FakeOpenAIServer() as model_server:
        model_server.add(text(final("收到")))
        bot = await running_bot(telegram_server, tmp_path,
                                llm=OpenAILLM(base_url=model_server.base_url, model="fake-qwen"))
        try:
            answer = await bot.ask(CHAT, ALICE, f"坏字符{LONE}在这里")
            await bot.all_handled()
        finally:
            await bot.stop()
    assert answer == "收到"
    request = json.dumps(model_server.chat_requests[0].body, ensure_ascii=False)
    assert f"坏字符{SHOWN}在这里" in request
    assert await bot.query("SELECT question, answer FROM turns") == [(f"坏字符{SHOWN}在这里", "收到")]
    [(payload,)] = await bot.query("SELECT payload FROM telegram_updates")  # journaled, handled, now its husk
    assert "text" not in json.loads(payload)["message"] and LONE not in payload
    assert errors_logged(caplog) == []


async def test_a_lone_surrogate_in_the_model_servers_answer_reaches_the_user_and_the_store_replaced(
        telegram_server, tmp_path, caplog):
    with FakeOpenAIServer() as model_server:
        model_server.add(text(final(f"答案{LONE}在此")))  # sent as a `\ud800` JSON escape
        bot = await running_bot(telegram_server, tmp_path,
                                llm=OpenAILLM(base_url=model_server.base_url, model="fake-qwen"))
        try:
            answer = await bot.ask(CHAT, ALICE, "question")
            await bot.all_handled()
        finally:
            await bot.stop()
    assert answer == f"答案{SHOWN}在此"
    assert await bot.query("SELECT answer FROM turns") == [(f"答案{SHOWN}在此",)]
    assert errors_logged(caplog) == []


async def test_an_answer_streamed_with_a_lone_surrogate_and_a_split_pair_shows_clean_text_as_it_grows(
        telegram_server, tmp_path, caplog):
    # The server's pieces come one at a time (each a JSON chunk of its own): a lone surrogate mid-answer, and an
    # emoji whose two surrogate halves arrive in two pieces. Drafts go out as the answer grows.
    pieces = ("Thought: I now know the final answer\nFinal Answer: 答案", f"{LONE}在此 ", "\ud83d", "\ude00")
    with FakeOpenAIServer() as model_server:
        model_server.add(Reply(text="".join(pieces), pieces=pieces, chunk_delay=0.3))
        bot = await running_bot(telegram_server, tmp_path, stream_interval_seconds=0.05,
                                llm=OpenAILLM(base_url=model_server.base_url, model="fake-qwen"))
        try:
            answer = await bot.ask(CHAT, ALICE, "question")
            await bot.all_handled()
        finally:
            await bot.stop()
    assert answer == f"答案{SHOWN}在此 😀"
    drafts = [call.params["text"] for call in telegram_server.calls_to("sendMessageDraft", ok=True)]
    assert f"答案{SHOWN}在此" in drafts  # shown while it grew, cleaned
    assert errors_logged(caplog) == []


async def test_a_telegram_message_with_a_lone_surrogate_is_sent_with_the_replacement_character(telegram_server):
    # Sends are cleaned too: text from anywhere inside the process (a trace, a tool's output) cannot break one.
    async with Bot(telegram_server.token, base_url=telegram_server.base_url) as bot:
        await send_text(bot, ALICE.id, f"**粗体**{LONE}和普通")  # formatted: the HTML attempt
        await send_text(bot, ALICE.id, f"plain {LONE} text and a pair \ud83d\ude00")
    assert telegram_server.sent_texts(ALICE.id) == [f"粗体{SHOWN}和普通", f"plain {SHOWN} text and a pair 😀"]


def test_qwenbot_ask_with_undecodable_bytes_in_its_argument_stores_the_turn(tmp_path):
    # Python reads undecodable command-line bytes as lone surrogates (surrogateescape).
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps([final("好的")]), encoding="utf-8")
    env = {**os.environ, "LLM_BACKEND": "scripted", "SCRIPTED_REPLIES_PATH": str(replies), "LOG_LEVEL": "WARNING",
           "DATABASE_PATH": str(tmp_path / "bot.sqlite3"), "PYTHONPATH": str(ROOT),
           "TOKENIZER_VOCAB_PATH": str(tmp_path / "absent.tiktoken")}
    done = subprocess.run([sys.executable, "-m", "bot.program.cli", "ask", "caf\xe9 ".encode("latin-1") + b"\xff"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "好的" and "Traceback" not in done.stderr
    with sqlite3.connect(tmp_path / "bot.sqlite3") as conn:
        assert conn.execute("SELECT question FROM turns").fetchall() == [(f"caf{SHOWN} {SHOWN}",)]
