"""Delivery, the database and restarts, round three (issue 43): each test is one probe of the outside attack run,
named after it, on the fake Bot API server (tests/fakes/telegram_server.py) or the real-process harness
(tests/test_faults_process.py's `BotProcess`).

1. update ids restarting at the same URL (a Bot API server restarted with its ids from 1);
2. every edit of a streamed group answer refused: no stale partial copy stays beside the answer;
3. sendMessage failing for a minute: the answer arrives once Telegram takes it again, before the next answer;
4. kill -9 right after answers are sent: nobody gets an answer twice after the restart;
5. the database held by another writer past the busy timeout: the answer is delivered, and stored later;
6. the database deleted while running: a notice to questions in flight, and no silent fresh database;
7. an admin command from a chat that is not allowed: no "admins only" into that chat.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from bot.telegram.i18n import text
from bot.telegram.replies import split_message
from db import DatabaseGone, DatabaseMissing
from tests.fakes.telegram_bot import (ADMIN, ALICE, BOB, CAROL, STRANGERS, TEAM, final, private_chat, running_bot,
                                      start_bot, telegram_server)
from tests.fakes.telegram_server import User
from tests.test_database_lock import hold_lock
from tests.test_faults_process import BotProcess, answers_by_question, database_state
from tests.test_holes_storage import delete_database, stopped_with
from tests.test_telegram_limits import LONG_ANSWER

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

ROOT = Path(__file__).resolve().parent.parent

CHAT = private_chat(ALICE)


# --- 1. update ids restarting at the same URL -------------------------------------------------------------------

def answers(server) -> list[str]:
    """What Alice got, without the notice that a question waits behind her previous one."""
    return [said for said in server.sent_texts(ALICE.id) if said != text("queued", "zh")]


async def test_probe_1_a_bot_api_server_restarted_at_the_same_url_loses_and_doubles_nothing_while_the_bot_runs(
        telegram_server, tmp_path):
    bot = await running_bot(telegram_server, tmp_path, [final(f"answer {n}") for n in range(12)])
    server = telegram_server
    try:
        for n in range(5):
            assert await bot.ask(CHAT, ALICE, f"before the restart {n}") == f"answer {n}"
        await bot.all_handled()
        server = bot.server = telegram_server.restarted()  # the same URL; its update ids start at 1 again
        for n in range(5, 12):  # each question holds its answer's number (answers are grounded)
            server.send_text(CHAT, ALICE, f"after the restart {n}")
        await server.wait_for(lambda: len(answers(server)) >= 7, 30, "seven answers")
        await bot.all_handled()
        await server.settle()
        server.redeliver(7)  # and Telegram's own redelivery is still recognised
        await server.settle()
    finally:
        await bot.stop()
        server.stop()
    assert answers(server) == [f"answer {n}" for n in range(5, 12)]  # none lost, none twice
    assert await bot.query("SELECT question, answer FROM turns ORDER BY id") == \
        [(f"before the restart {n}", f"answer {n}") for n in range(5)] + \
        [(f"after the restart {n}", f"answer {n}") for n in range(5, 12)]


@pytest.mark.parametrize("pruned", [False, True], ids=["at-once", "days-later"])
async def test_probe_1_a_bot_api_server_restarted_with_the_bot_loses_nothing_and_reuses_no_answer(
        telegram_server, tmp_path, pruned):
    first = await running_bot(telegram_server, tmp_path, [final(f"answer {n}") for n in range(5)])
    for n in range(5):
        assert await first.ask(CHAT, ALICE, f"before the restart {n}") == f"answer {n}"
    await first.stop()
    if pruned:  # days later, the journal has forgotten those updates; their turns stay (under ids 1 to 5)
        assert len(await first.query("DELETE FROM telegram_updates RETURNING update_id")) == 5
    server = telegram_server.restarted()
    for n in range(7):
        server.send_text(CHAT, ALICE, f"after the restart {n}")
    second = await running_bot(server, tmp_path, [final(f"new answer {n}") for n in range(7)])
    try:
        await server.wait_for(lambda: len(answers(server)) >= 7, 30, "seven answers")
        await second.all_handled()
        await server.settle()
    finally:
        await second.stop()
        server.stop()
    # Each asked the model: none answered from the turn an earlier update of the same id asked for.
    assert answers(server) == [f"new answer {n}" for n in range(7)]
    assert len(second.llm.requests) == 7
    source = f"{server.bot.id}@{server.base_url}"
    assert await second.query("SELECT source, count(*) FROM telegram_updates GROUP BY source ORDER BY source") == \
        ([] if pruned else [(source, 5)]) + [(f"{source}#2", 7)]


# --- 2. every edit of a streamed group answer refused --------------------------------------------------------

async def test_probe_2_a_streamed_group_answer_whose_edits_are_all_refused_ends_as_exactly_its_pieces(
        start_bot, telegram_server):
    telegram_server.fail("editMessageText", status=400, description="Bad Request: message can't be edited",
                         times=-1)
    bot = await start_bot([final(LONG_ANSWER)], token_seconds=0.0005, group_stream_interval_seconds=0.2)
    telegram_server.send_text(TEAM, CAROL, "/ask tell me everything")
    await bot.answers(TEAM.id, 1, timeout=30)
    await bot.turns_done(timeout=60)

    pieces = split_message(LONG_ANSWER)
    assert len(pieces) == 3
    assert telegram_server.calls_to("editMessageText", ok=False)  # it streamed, and Telegram refused the edits
    assert telegram_server.visible_messages(TEAM.id) == pieces  # no stale partial copy beside the pieces


# --- 3. sendMessage failing for a while ----------------------------------------------------------------------

async def test_probe_3_an_answer_telegram_refused_for_a_while_arrives_without_a_restart_before_the_next_one(
        start_bot, telegram_server):
    # The probe's minute, scaled down: the outage outlasts one try of the answer (SEND_PATIENCE_SECONDS), and the
    # next question comes once Telegram takes messages again, before the first answer's next try is due.
    bot = await start_bot([final("first answer"), final("second answer")], send_patience_seconds=0.5,
                          answer_resend_seconds=1.5)
    outage = telegram_server.fail("sendMessage", status=502, for_seconds=1.2)
    telegram_server.send_text(CHAT, ALICE, "first question")
    await telegram_server.wait_for(lambda: telegram_server.calls_to("sendMessage"), 10, "the first try")
    await telegram_server.wait_for(lambda: time.monotonic() > outage.until, 10, "the outage to end")
    telegram_server.send_text(CHAT, ALICE, "second question")

    await telegram_server.wait_for(lambda: "second answer" in telegram_server.sent_texts(ALICE.id), 20,
                                   "the second answer")
    await bot.all_handled()
    await telegram_server.settle()
    # In order and each once, without a restart; the second question was told it waits for the first.
    assert telegram_server.sent_texts(ALICE.id) == [text("queued", "zh"), "first answer", "second answer"]
    assert len(bot.llm.requests) == 2
    assert await bot.query("SELECT question, answer FROM turns ORDER BY id") == [
        ("first question", "first answer"), ("second question", "second answer")]


# --- 4. kill -9 right after answers are sent ---------------------------------------------------------------------

def delivered_pieces(path: Path) -> int:
    """How many answer pieces the database lists as delivered (0 while there is no such list)."""
    try:
        with closing(database_state(path)) as conn:
            return conn.execute("SELECT count(*) FROM answer_deliveries").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


async def test_probe_4_a_process_killed_right_after_its_answers_went_out_sends_none_of_them_again(telegram_server,
                                                                                                 tmp_path):
    users = [User(6001 + index, f"User{index}", "en") for index in range(6)]
    for user in users:
        telegram_server.send_text(private_chat(user), user, f"{user.first_name}'s question")
    # Each turn shows a progress message; deleting it, right after the answer went out, hangs: so the kill lands
    # after every answer was sent and before any update is marked handled, on a machine however slow.
    telegram_server.fail("deleteMessage", status=200, delay=60, times=len(users))
    settings = {"PROGRESS_AFTER_SECONDS": "0.1", "ALLOWED_USER_IDS": ",".join(str(user.id) for user in users)}
    first = BotProcess(telegram_server, tmp_path, "first run", settings)
    try:
        await telegram_server.wait_for(lambda: len(answers_by_question(telegram_server)) == len(users), 60,
                                       "every answer to go out")
        # The records are written the moment Telegram's replies arrive; give them that moment, not more.
        deadline = time.monotonic() + 2
        while delivered_pieces(tmp_path / "bot.sqlite3") < len(users) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        first.kill()
    with closing(database_state(tmp_path / "bot.sqlite3")) as conn:
        assert conn.execute("SELECT count(*) FROM telegram_updates WHERE handled_at IS NULL").fetchone() == (6,)

    second = BotProcess(telegram_server, tmp_path, "second run", settings)
    try:
        await telegram_server.wait_for(lambda: not unhandled(tmp_path / "bot.sqlite3"), 60,
                                       "the second run to handle what the first left")
        await telegram_server.settle(0.5)
    finally:
        assert second.terminate() == 0, second.output()
    assert "Traceback" not in first.output() + second.output()

    answers = answers_by_question(telegram_server)
    assert len(answers) == len(users)
    assert {key: texts for key, texts in answers.items() if len(texts) != 1} == {}  # nobody got theirs twice
    assert all(texts[0].startswith("first run") for texts in answers.values())
    assert all(telegram_server.visible_messages(user.id) == answers[(user.id, 1)] for user in users)


def unhandled(path: Path) -> int:
    """Updates the journal holds as not handled yet."""
    with closing(database_state(path)) as conn:
        return conn.execute("SELECT count(*) FROM telegram_updates WHERE handled_at IS NULL").fetchone()[0]


# --- 5. the database held by another writer past the busy timeout ------------------------------------------------

async def test_probe_5_an_answer_whose_save_meets_a_long_lock_is_delivered_and_stored_once_the_lock_frees(
        start_bot, telegram_server):
    # The probe's 15 s lock against the default 10 s busy timeout, scaled down: 2 s against 0.3 s.
    bot = await start_bot([final("答案"), final("又好了")], delay=0.5, database_busy_timeout_seconds=0.3)
    telegram_server.send_text(CHAT, ALICE, "问题")
    await telegram_server.wait_for(lambda: bot.llm.requests, message="the model to start")
    holder = hold_lock(bot.settings.storage.database_path, 2.0)  # taken while the model works: the save meets it

    assert await bot.answers(ALICE.id, 1, timeout=10) == ["答案"]  # not "数据库正忙…没能保存"
    assert holder.poll() is None  # delivered while the other process still held the database
    await asyncio.to_thread(holder.wait, 10)
    await bot.all_handled(timeout=10)
    assert await bot.query("SELECT question, answer, status FROM turns") == [("问题", "答案", "answered")]
    assert await bot.ask(CHAT, ALICE, "再试") == "又好了"
    seen = bot.llm.requests[-1].text
    assert "问题" in seen and "答案" in seen.split("再试")[0]  # the stored turn is in the next one's history
    await telegram_server.settle()
    assert telegram_server.sent_texts(ALICE.id) == ["答案", "又好了"]


# --- 6. the database deleted while running ----------------------------------------------------------------------

def qwenbot(server, folder: Path, *args: str) -> subprocess.CompletedProcess:
    """The real `qwenbot` command on the database in `folder`, against the fake Bot API server."""
    env = {**os.environ, "TELEGRAM_BOT_TOKEN": server.token, "TELEGRAM_BASE_URL": server.base_url,
           "LLM_BACKEND": "scripted", "SCRIPTED_REPLIES_PATH": str(folder / "absent.json"),
           "DATABASE_PATH": str(folder / "bot.sqlite3"), "TOKENIZER_VOCAB_PATH": str(folder / "absent.tiktoken"),
           "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "bot.program.cli", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)


async def test_probe_6_a_database_deleted_while_running_tells_questions_in_flight_and_is_not_made_anew_silently(
        telegram_server, tmp_path):
    bot = await running_bot(telegram_server, tmp_path, [final("never sent")] * 2, delay=60,
                            database_check_seconds=0.2)
    admin = private_chat(ADMIN)
    try:
        assert await bot.ask(admin, ADMIN, f"/deny {ALICE.id}") == f"✅ user {ALICE.id} is denied."
        telegram_server.send_text(admin, ADMIN, "a slow question")  # running when the file goes
        telegram_server.send_text(admin, ADMIN, "and another")  # waiting behind it
        await telegram_server.wait_for(lambda: bot.llm.requests, 10, "the model to start")
        delete_database(bot.settings.storage.database_path)
        assert isinstance(await stopped_with(bot), DatabaseGone)
    finally:
        if not bot.task.done():
            await bot.stop()
    gone = text("database_gone", "en")
    assert telegram_server.sent_texts(ADMIN.id).count(gone) == 2  # each question in flight was told

    path = bot.settings.storage.database_path
    with pytest.raises(DatabaseMissing, match="--new-database"):
        await running_bot(telegram_server, tmp_path)  # the restart refuses: the /deny is not undone silently
    assert not path.exists()
    run = await asyncio.to_thread(qwenbot, telegram_server, tmp_path, "run")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(f"qwenbot: the database {path} is missing, but ")
    migrate = await asyncio.to_thread(qwenbot, telegram_server, tmp_path, "migrate")
    assert migrate.returncode == 2 and not path.exists()

    migrate = await asyncio.to_thread(qwenbot, telegram_server, tmp_path, "migrate", "--new-database")
    assert migrate.returncode == 0, migrate.stderr
    assert path.exists()  # made anew, on purpose
    fresh = await running_bot(telegram_server, tmp_path, [final("hello again")])
    try:
        assert await fresh.ask(private_chat(ALICE), ALICE, "hi") == "hello again"  # the new database's own access
    finally:
        await fresh.stop()


# --- 7. an admin command from a chat that is not allowed -------------------------------------------------------

async def test_probe_7_an_admin_command_from_a_chat_that_is_not_allowed_gets_no_admins_only_reply(start_bot,
                                                                                                  telegram_server):
    bot = await start_bot()
    courses = await bot.query("SELECT name FROM courses ORDER BY id")
    # Forged: no sender, as a channel's post looks, in a group nobody allowed. Nobody to refuse, so nothing.
    telegram_server.push_message(STRANGERS, None, sender_chat=STRANGERS.as_dict(), text="/course_del 大模型技术实战")
    # A stranger there, and one in private: the refusal every message of a stranger gets (once), no admin line.
    dave = User(4004, "Dave", "en")
    telegram_server.send_text(STRANGERS, BOB, "/deny 1001")
    telegram_server.send_text(private_chat(dave), dave, "/course_del 大模型技术实战")
    await bot.all_handled()
    await telegram_server.settle()

    assert telegram_server.sent_texts(STRANGERS.id) == [text("not_allowed", "en", user_id=BOB.id)]
    assert telegram_server.sent_texts(dave.id) == [text("not_allowed", "en", user_id=dave.id)]
    assert not any("admins only" in said for said in telegram_server.sent_texts())
    assert await bot.query("SELECT name FROM courses ORDER BY id") == courses
    assert await bot.query("SELECT * FROM access_list") == []
    # Where the bot may talk, a non-admin still learns that the command is for admins (in their language: Alice's
    # Telegram is in Chinese).
    assert await bot.ask(private_chat(ALICE), ALICE, "/course_del 大模型技术实战") == text("admins_only", "zh")
