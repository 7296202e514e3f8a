"""Faults of the process and its database: `qwenbot run` killed with SIGKILL in the middle of turns and started
again; another process holding the database's write lock while updates arrive and turns are saved.

The kill test runs the real command as a subprocess (LLM_BACKEND=scripted, SCRIPTED_DELAY_SECONDS so that turns
are in flight when the signal lands) against the fake Bot API server. The lock tests run the bot in the test's
event loop and take the lock from a second process (tests/test_database_lock.py does the same below Telegram).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

from bot.program.config import Settings
from bot.telegram.intake import journal_source, turn_source_key
from tests.fakes.telegram_bot import ALICE, final, private_chat, start_bot, telegram_server
from tests.fakes.telegram_server import FakeTelegramServer, User
from tests.test_database_lock import hold_lock

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

ROOT = Path(__file__).resolve().parent.parent
CHAT = private_chat(ALICE)


def database_state(path: Path) -> sqlite3.Connection:
    """A plain connection to the bot's database (opening it is what the next start does first)."""
    return sqlite3.connect(path, isolation_level=None)


def assert_intact(conn: sqlite3.Connection) -> None:
    """SQLite's own checks: the file is whole and every foreign key points somewhere."""
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


def assert_every_turn_whole_in_the_history(conn: sqlite3.Connection) -> None:
    """Each answered turn has exactly its question and its answer in `messages`, and no message is an orphan."""
    turns = conn.execute("SELECT id, question, answer FROM turns WHERE status = 'answered' ORDER BY id").fetchall()
    for turn_id, question, answer in turns:
        rows = conn.execute("SELECT role, content FROM messages WHERE turn_id = ? ORDER BY id", (turn_id,)).fetchall()
        assert rows == [("user", question), ("assistant", answer)], f"turn {turn_id} is not whole: {rows}"
    orphans = conn.execute("SELECT count(*) FROM messages WHERE turn_id NOT IN (SELECT id FROM turns)").fetchone()
    assert orphans == (0,)


# --- SIGKILL in the middle of turns ----------------------------------------------------------------------------

USERS = [User(5001 + index, f"User{index}", "en") for index in range(4)]
QUESTIONS_EACH = 3
MODEL_SECONDS = 0.6  # per model call: a turn is in flight long enough for the kill to land in one


class BotProcess:
    """`qwenbot run` as a child process, its logs in files (a pipe nobody reads could fill up and block it)."""

    def __init__(self, server: FakeTelegramServer, folder: Path, answer_prefix: str,
                 settings: dict[str, str] | None = None):
        replies = folder / f"{answer_prefix}.json"
        replies.write_text(json.dumps([final(f"{answer_prefix} #{n}") for n in range(50)]), encoding="utf-8")
        env = {**os.environ, "TELEGRAM_BOT_TOKEN": server.token, "TELEGRAM_BASE_URL": server.base_url,
               "LLM_BACKEND": "scripted", "SCRIPTED_REPLIES_PATH": str(replies),
               "SCRIPTED_DELAY_SECONDS": str(MODEL_SECONDS), "DATABASE_PATH": str(folder / "bot.sqlite3"),
               "ALLOWED_USER_IDS": ",".join(str(user.id) for user in USERS), "SHUTDOWN_GRACE_SECONDS": "5",
               "TOKENIZER_VOCAB_PATH": str(folder / "absent.tiktoken"), "PYTHONPATH": str(ROOT),
               # The scripted replies are numbered labels ("first run #3"), not answers grounded in a lookup.
               "GROUNDED_ANSWERS": "false", **(settings or {})}
        self.log = folder / f"{answer_prefix}.log"
        with open(self.log, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "bot.program.cli", "run"], cwd=folder, env=env,
                                            stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL: no handler, no shutdown, no flush; the kernel just ends it."""
        self.process.send_signal(signal.SIGKILL)
        assert self.process.wait(10) == -signal.SIGKILL

    def terminate(self) -> int:
        """SIGTERM, as `systemctl stop` does; its exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(30)

    def output(self) -> str:
        """Everything it logged."""
        return self.log.read_text(encoding="utf-8")


def turn_key(server: FakeTelegramServer, update_id: int) -> str:
    """The `source_key` a `qwenbot run` against `server` stores the turn of update `update_id` under."""
    settings = Settings.of(telegram_bot_token=server.token, telegram_base_url=server.base_url)
    return turn_source_key(journal_source(server.bot.id, settings), update_id)


def answers_by_question(server: FakeTelegramServer) -> dict[int, list[str]]:
    """Accepted answers (not notices) by the message they reply to: (chat id, message id) → texts."""
    found: dict[tuple[int, int], list[str]] = {}
    for call in server.sent():
        text = call.result["text"]
        if " #" in text and call.params.get("reply_parameters"):
            key = (int(call.params["chat_id"]), int(call.params["reply_parameters"]["message_id"]))
            found.setdefault(key, []).append(text)
    return found


# About 5 s: two real processes start (imports take a second or two on two cores), turns take 0.6 s each
async def test_a_process_killed_mid_turn_restarts_cleanly_and_answers_every_question_once(telegram_server, tmp_path):
    questions = {}  # (chat id, message id) → update id
    for round_ in range(QUESTIONS_EACH):
        for user in USERS:
            message_id = telegram_server.send_text(private_chat(user), user, f"{user.first_name} question {round_}")
            questions[(user.id, message_id)] = max(telegram_server.pending_updates)
    first = BotProcess(telegram_server, tmp_path, "first run")
    try:
        # Kill once the first round is answered: the second round's turns are then half-way through the model.
        await telegram_server.wait_for(lambda: len(answers_by_question(telegram_server)) >= len(USERS), 30,
                                       "the first round of answers")
        await asyncio.sleep(MODEL_SECONDS / 2)
    finally:
        first.kill()
    before_restart = answers_by_question(telegram_server)

    with closing(database_state(tmp_path / "bot.sqlite3")) as conn:  # what the kill left behind
        assert_intact(conn)
        assert_every_turn_whole_in_the_history(conn)
        handled = {update_id for (update_id,) in
                   conn.execute("SELECT update_id FROM telegram_updates WHERE handled_at IS NOT NULL")}
        stored = {row[0] for row in conn.execute("SELECT source_key FROM turns")}
    assert len(handled) < len(questions), "the kill came too late to interrupt anything"
    down = USERS[0]
    message_id = telegram_server.send_text(private_chat(down), down, "asked while the bot was down")
    questions[(down.id, message_id)] = max(telegram_server.pending_updates)

    second = BotProcess(telegram_server, tmp_path, "second run")
    try:
        await telegram_server.wait_for(lambda: len(answers_by_question(telegram_server)) == len(questions), 30,
                                       "every question to be answered after the restart")
        await telegram_server.settle(0.5)
    finally:
        status = second.terminate()
    assert status == 0, second.output()
    assert "Traceback" not in first.output() + second.output()

    answers = answers_by_question(telegram_server)
    for key, update_id in questions.items():
        texts = answers[key]
        if update_id in handled or turn_key(telegram_server, update_id) not in stored:
            assert len(texts) == 1, (key, texts)  # answered and recorded before the kill; or only after it
        else:
            # Stored before the kill, not yet recorded as handled: sent again from the store, never asked again.
            assert len(texts) in (1, 2) and set(texts) == {texts[0]} and texts[0].startswith("first run"), texts
        assert texts[:len(before_restart.get(key, []))] == before_restart.get(key, [])

    with closing(database_state(tmp_path / "bot.sqlite3")) as conn:
        assert_intact(conn)
        assert_every_turn_whole_in_the_history(conn)
        keys = Counter(key for (key,) in conn.execute("SELECT source_key FROM turns"))
        assert keys == Counter({turn_key(telegram_server, update_id): 1 for update_id in questions.values()})
        assert conn.execute("SELECT count(*) FROM telegram_updates WHERE handled_at IS NULL").fetchone() == (0,)
        delivered = {(chat, texts[0]) for (chat, _), texts in answers.items()}
        stored_answers = set(conn.execute("SELECT sessions.chat_id, answer FROM turns JOIN sessions "
                                          "ON sessions.id = turns.session_id"))
        assert delivered == stored_answers  # what each user saw is what the history holds


# --- the database locked by another process --------------------------------------------------------------------

def lock_rows(path: Path) -> list[tuple]:
    """What the lock-holding process wrote: it committed, and nothing of ours overwrote it."""
    with closing(database_state(path)) as conn:
        assert_intact(conn)
        return conn.execute("SELECT action FROM audit_log WHERE action = 'lock'").fetchall()


async def test_a_turn_whose_save_meets_a_lock_of_a_few_seconds_waits_for_it_and_is_answered(start_bot,
                                                                                             telegram_server):
    bot = await start_bot([final("答案")], delay=0.5)  # DATABASE_BUSY_TIMEOUT_SECONDS: the default 10
    telegram_server.send_text(CHAT, ALICE, "问题")
    await telegram_server.wait_for(lambda: bot.llm.requests, message="the model to start")
    holder = hold_lock(bot.settings.storage.database_path, 2.0)  # taken while the model works: the save meets it
    locked_at = time.monotonic()

    assert await bot.answers(ALICE.id, 1, timeout=10) == ["答案"]
    assert time.monotonic() - locked_at >= 1.5  # it waited for the other process
    holder.wait(10)
    await telegram_server.settle()
    assert telegram_server.sent_texts(ALICE.id) == ["答案"]
    assert await bot.query("SELECT role, content FROM messages ORDER BY id") == [("user", "问题"), ("assistant", "答案")]
    await bot.all_handled()
    assert lock_rows(bot.settings.storage.database_path) == [("lock",)]


async def test_updates_that_arrive_while_the_database_is_locked_wait_at_telegram_and_are_answered_once(
        start_bot, telegram_server):
    bot = await start_bot([final("答案")], database_busy_timeout_seconds=0.2)
    holder = hold_lock(bot.settings.storage.database_path, 2.0)
    telegram_server.send_text(CHAT, ALICE, "问题")  # fetched, but the journal cannot take it yet

    assert await bot.answers(ALICE.id, 1, timeout=10) == ["答案"]
    holder.wait(10)
    await telegram_server.settle()
    assert telegram_server.sent_texts(ALICE.id) == ["答案"]
    # The poll was repeated from the same offset until the journal could take the update: nothing was confirmed
    # to Telegram before it was written down.
    fetched = [c for c in telegram_server.calls_to("getUpdates", ok=True) if c.result]
    assert len(fetched) >= 2 and {c.params.get("offset") for c in fetched} == {fetched[0].params.get("offset")}
    assert await bot.query("SELECT count(*) FROM turns") == [(1,)]
    assert lock_rows(bot.settings.storage.database_path) == [("lock",)]


async def test_a_lock_that_outlasts_the_save_wait_still_delivers_the_answer_and_stores_nothing_half(start_bot,
                                                                                                   telegram_server):
    # The answer goes out although its turn cannot be stored (tests/test_holes_restarts.py, probe 5); storing it
    # is given up after ANSWER_SAVE_WAIT_SECONDS, which the lock outlasts here.
    bot = await start_bot([final("存不下的答案"), final("又好了")], delay=0.5, database_busy_timeout_seconds=0.3,
                          answer_save_wait_seconds=0.5)
    telegram_server.send_text(CHAT, ALICE, "问题")
    await telegram_server.wait_for(lambda: bot.llm.requests, message="the model to start")
    holder = hold_lock(bot.settings.storage.database_path, 3.0)

    assert await bot.answers(ALICE.id, 1, timeout=10) == ["存不下的答案"]
    await asyncio.to_thread(holder.wait, 10)  # the bot runs on meanwhile, and gives up storing the turn
    assert await bot.ask(CHAT, ALICE, "再试") == "又好了"
    assert await bot.query("SELECT question, status FROM turns") == [("再试", "answered")]  # nothing half-saved
    assert await bot.query("SELECT content FROM messages ORDER BY id") == [("再试",), ("又好了",)]
    assert lock_rows(bot.settings.storage.database_path) == [("lock",)]
