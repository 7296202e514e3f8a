"""Answers that do not get through, and leftovers of a killed process (issue 13): an answer Telegram refuses for
longer than SEND_PATIENCE_SECONDS is sent again from the store while the bot runs, not only after a restart; a
progress message ("⏳ 正在思考…") left by a process killed mid-turn is deleted when the next one starts.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from bot.telegram.i18n import text
from tests.fakes.telegram_bot import ALICE, final, private_chat, start_bot, telegram_server
from tests.fakes.telegram_server import FakeTelegramServer

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

ROOT = Path(__file__).resolve().parent.parent
CHAT = private_chat(ALICE)


# --- an answer Telegram keeps refusing -------------------------------------------------------------------------

async def test_an_answer_refused_past_the_send_window_is_sent_again_from_the_store_while_running(start_bot,
                                                                                                  telegram_server):
    bot = await start_bot([final("stored answer")], send_patience_seconds=1.0, answer_resend_seconds=0.5)
    outage = telegram_server.fail("sendMessage", status=502, times=-1)
    telegram_server.send_text(CHAT, ALICE, "question")
    # One delivery gives up after 1 s (two attempts); half a second later the resend from the store tries again.
    await telegram_server.wait_for(lambda: len(telegram_server.calls_to("sendMessage")) >= 4, 15,
                                   "a second delivery from the store")
    outage.stop()

    assert await bot.answers(ALICE.id, 1, timeout=15) == ["stored answer"]
    await bot.all_handled()
    await telegram_server.settle()
    assert telegram_server.sent_texts(ALICE.id) == ["stored answer"]  # once, and no apology before it
    assert len(bot.llm.requests) == 1  # the model was asked once: the rest came from the store
    assert await bot.query("SELECT count(*) FROM turns") == [(1,)]


async def test_a_resend_waiting_at_shutdown_is_left_for_the_next_start(start_bot, telegram_server):
    first = await start_bot([final("stored answer")], send_patience_seconds=0.4, answer_resend_seconds=3600)
    outage = telegram_server.fail("sendMessage", status=502, times=-1)
    telegram_server.send_text(CHAT, ALICE, "question")
    await telegram_server.wait_for(lambda: telegram_server.calls_to("sendMessage"), 10, "the first try")
    await telegram_server.settle()  # the first try gave up; the next is an hour away
    await first.stop()  # does not wait an hour for it
    assert await first.query("SELECT update_id FROM telegram_updates WHERE handled_at IS NULL") == [(1,)]

    outage.stop()
    second = await start_bot()
    assert await second.answers(ALICE.id, 1) == ["stored answer"]
    await second.all_handled()


# --- a progress message left by a killed process ---------------------------------------------------------------

def start_process(server: FakeTelegramServer, folder: Path) -> subprocess.Popen:
    """`qwenbot run` whose model takes 60 s a call and whose progress message shows at once."""
    replies = folder / "replies.json"
    replies.write_text(json.dumps([final("never sent")]), encoding="utf-8")
    env = {**os.environ, "TELEGRAM_BOT_TOKEN": server.token, "TELEGRAM_BASE_URL": server.base_url,
           "LLM_BACKEND": "scripted", "SCRIPTED_REPLIES_PATH": str(replies), "SCRIPTED_DELAY_SECONDS": "60",
           "PROGRESS_AFTER_SECONDS": "0.1", "DATABASE_PATH": str(folder / "bot.sqlite3"),
           "ALLOWED_USER_IDS": str(ALICE.id), "TOKENIZER_VOCAB_PATH": str(folder / "absent.tiktoken"),
           "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "bot.program.cli", "run"], cwd=folder, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def listed_progress(path: Path) -> list[tuple]:
    """The progress messages the database lists, read as the next start would."""
    import sqlite3

    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT chat_id, message_id FROM progress_messages").fetchall()


async def test_a_progress_message_left_by_a_killed_process_is_deleted_at_the_next_start(start_bot, telegram_server,
                                                                                       tmp_path):
    thinking = text("thinking", "zh")
    process = start_process(telegram_server, tmp_path)
    try:
        telegram_server.send_text(CHAT, ALICE, "a slow question")
        await telegram_server.wait_for(lambda: thinking in telegram_server.visible_messages(ALICE.id), 30,
                                       "the progress message")
        # Listed right after it is sent; waiting for the row keeps the kill out of that instant.
        await telegram_server.wait_for(lambda: listed_progress(tmp_path / "bot.sqlite3"), 10, "the progress row")
    finally:
        process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(process.wait, 10)
    assert telegram_server.visible_messages(ALICE.id) == [thinking]

    bot = await start_bot([final("answered after the restart")])
    assert await bot.answers(ALICE.id, 2) == [thinking, "answered after the restart"]
    await bot.all_handled()
    await telegram_server.settle()
    assert telegram_server.visible_messages(ALICE.id) == ["answered after the restart"]
    assert await bot.query("SELECT * FROM progress_messages") == []


async def test_a_progress_message_deleted_normally_is_not_listed_any_more(start_bot, telegram_server):
    bot = await start_bot([final("slow answer")], delay=0.6, progress_after_seconds=0.1)
    assert await bot.ask(CHAT, ALICE, "question") == text("thinking", "zh")
    assert await bot.answers(ALICE.id, 2) == [text("thinking", "zh"), "slow answer"]
    await bot.all_handled()
    await telegram_server.settle()
    assert telegram_server.visible_messages(ALICE.id) == ["slow answer"]
    assert await bot.query("SELECT * FROM progress_messages") == []
