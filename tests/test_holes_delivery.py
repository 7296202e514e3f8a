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

from bot.i18n import text
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
    await telegram_server.wait_for(lambda: first.application.bot_data["turns"].active == 0 and
                                   telegram_server.calls_to("sendMessage"), 10, "the delivery to give up")
    await first.stop()  # does not wait an hour for the resend
    assert await first.query("SELECT update_id FROM telegram_updates WHERE handled_at IS NULL") == [(1,)]

    outage.stop()
    second = await start_bot()
    assert await second.answers(ALICE.id, 1) == ["stored answer"]
    await second.all_handled()
