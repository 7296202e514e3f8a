"""The update journal belongs to one bot at one Bot API server: update ids that start again at another server are
new updates, not repeats; what the journal skips is logged; rows from before the journal had sources are kept.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from contextlib import closing

from db import open_database
from db.migrate import MIGRATIONS_FOLDER
from tests.fakes.telegram_bot import ALICE, final, private_chat, running_bot, start_bot, telegram_server
from tests.fakes.telegram_server import FakeTelegramServer
from tests.test_migrations import write

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

CHAT = private_chat(ALICE)


async def test_a_new_bot_api_server_whose_update_ids_start_again_is_answered(telegram_server, tmp_path):
    first = await running_bot(telegram_server, tmp_path, [final(f"first server {n}") for n in range(3)])
    for n in range(3):
        assert await first.ask(CHAT, ALICE, f"question {n}") == f"first server {n}"
    await first.stop()

    # A local Bot API server reinstalled (or a test server): its update ids start at 1 again.
    with FakeTelegramServer() as other:
        second = await running_bot(other, tmp_path, [final(f"second server {n}") for n in range(3)])
        try:
            for n in range(3):
                assert await second.ask(CHAT, ALICE, f"again {n}") == f"second server {n}"
        finally:
            await second.stop()
    rows = await second.query("SELECT question, answer FROM turns ORDER BY id")
    assert rows == [(f"question {n}", f"first server {n}") for n in range(3)] + \
        [(f"again {n}", f"second server {n}") for n in range(3)]


async def test_what_the_journal_skips_is_logged(start_bot, telegram_server, caplog):
    bot = await start_bot([final("the answer")])
    assert await bot.ask(CHAT, ALICE, "question") == "the answer"
    with caplog.at_level(logging.INFO, logger="bot.telegram.intake"):
        telegram_server.redeliver(1)  # Telegram never saw the confirmation
        await telegram_server.wait_for(lambda: "update 1 is already in the journal" in caplog.text, 5,
                                       "the skipped update to be logged")
    await telegram_server.settle()
    assert telegram_server.sent_texts(ALICE.id) == ["the answer"]


async def test_updates_another_server_left_unhandled_are_logged_and_left_alone(telegram_server, tmp_path, caplog):
    first = await running_bot(telegram_server, tmp_path, [final("too slow")], delay=30)
    telegram_server.send_text(CHAT, ALICE, "asked at the first server")
    await telegram_server.wait_for(lambda: first.llm.requests, message="the model to start")
    await first.stop()  # the turn is stopped: its update stays unhandled, to be answered by that server's bot

    with FakeTelegramServer() as other, caplog.at_level(logging.WARNING, logger="bot.telegram.intake"):
        second = await running_bot(other, tmp_path, [final("second server")])
        try:
            assert await second.ask(CHAT, ALICE, "asked at the second server") == "second server"
            await other.settle()
        finally:
            await second.stop()
    assert f"1 update(s) from {telegram_server.bot.id}@{telegram_server.base_url} were left unhandled" in caplog.text
    assert other.sent_texts(ALICE.id) == ["second server"]
    assert [r.text for r in second.llm.requests if "asked at the first server" in r.text] == []


async def test_an_update_journaled_before_the_upgrade_is_claimed_and_answered_after_it(telegram_server, tmp_path):
    # The database as the previous version left it: an update journaled (no source yet), never handled.
    before = [p for p in sorted(MIGRATIONS_FOLDER.glob("*.sql")) if p.name < "0009"]
    folder = write(tmp_path / "before_0009", {p.name: p.read_text(encoding="utf-8") for p in before})
    old = await open_database(tmp_path / "bot.sqlite3", migrations_folder=folder)
    update = {"update_id": 1, "message": {"message_id": 1, "date": int(time.time()), "text": "asked before",
                                          "chat": CHAT.as_dict(), "from": ALICE.as_dict()}}
    async with old.transaction() as conn:
        await conn.execute("INSERT INTO telegram_updates (update_id, payload) VALUES (1, ?)", (json.dumps(update),))
    await old.close()

    bot = await running_bot(telegram_server, tmp_path, [final("answered after the upgrade")])
    try:
        assert await bot.answers(ALICE.id, 1) == ["answered after the upgrade"]
        await bot.all_handled()
    finally:
        await bot.stop()
    assert await bot.query("SELECT source_key, question FROM turns") == [(bot.source_key(1), "asked before")]
    assert await bot.query("SELECT source, handled_at IS NOT NULL FROM telegram_updates") == \
        [(f"{telegram_server.bot.id}@{telegram_server.base_url}", 1)]


async def test_a_turn_stored_before_the_upgrade_is_not_asked_again(telegram_server, tmp_path):
    first = await running_bot(telegram_server, tmp_path, [final("stored before the upgrade")])
    assert await first.ask(CHAT, ALICE, "question") == "stored before the upgrade"
    await first.stop()
    with closing(sqlite3.connect(tmp_path / "bot.sqlite3")) as conn, conn:
        # What 0009 makes of a turn stored, and its update not yet marked handled (so still whole in the
        # journal, not the husk a handled update leaves), by the previous version.
        conn.execute("UPDATE telegram_updates SET source = '', handled_at = NULL, payload = ?",
                     (json.dumps(telegram_server.pushed(1)),))
        conn.execute("UPDATE turns SET source_key = 'tg:update:1'")
        conn.execute("DELETE FROM answer_deliveries")  # that version recorded no deliveries (0014)

    second = await running_bot(telegram_server, tmp_path)
    try:
        # Handled again, as an update left unhandled is; its turn is found under its new key, not asked again.
        assert await second.answers(ALICE.id, 2) == ["stored before the upgrade"] * 2
        await second.all_handled()
    finally:
        await second.stop()
    assert second.llm.requests == []
    assert await second.query("SELECT source_key FROM turns") == [(second.source_key(1),)]
