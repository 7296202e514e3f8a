"""Two `qwenbot run` processes on one database: the second waits for the first (a rolling restart) or gives up
with one line; either way no question is answered twice.

Real processes (LLM_BACKEND=scripted, SCRIPTED_DELAY_SECONDS so that turns are in flight) against the fake Bot API
server, as in tests/test_faults_process.py. Before the database had an instance lock, the second process replayed
the journal rows the first was still working on, and a rolling restart doubled every answer in flight.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import closing

from tests.fakes.telegram_bot import private_chat, telegram_server
from tests.fakes.telegram_server import FakeTelegramServer
from tests.test_faults_process import (USERS, BotProcess, answers_by_question, assert_every_turn_whole_in_the_history,
                                       assert_intact, database_state)

__all__ = ["telegram_server"]  # the fixture, used by name

START_SECONDS = 60  # two Python processes importing torch-free code on a loaded two-core box


def ask(server: FakeTelegramServer, questions: dict[tuple[int, int], int], user_index: int, text: str) -> None:
    """A user asks; the question is remembered by (chat id, message id) with its update id."""
    user = USERS[user_index]
    message_id = server.send_text(private_chat(user), user, text)
    questions[(user.id, message_id)] = max(server.pending_updates)


def stop_all(*processes: BotProcess) -> None:
    """Whatever a failed test left running."""
    for process in processes:
        if process.process.poll() is None:
            process.process.kill()
            process.process.wait(10)


async def test_a_second_qwenbot_run_on_the_same_database_gives_up_with_one_line(telegram_server, tmp_path):
    questions: dict[tuple[int, int], int] = {}
    first = BotProcess(telegram_server, tmp_path, "first run")
    second = None
    try:
        ask(telegram_server, questions, 0, "are you there?")
        await telegram_server.wait_for(lambda: answers_by_question(telegram_server), START_SECONDS, "the first to serve")
        second = BotProcess(telegram_server, tmp_path, "second run", {"INSTANCE_LOCK_WAIT_SECONDS": "1"})
        status = await asyncio.to_thread(second.process.wait, START_SECONDS)
        output = second.output()
        assert status == 2, output
        assert output.strip().splitlines()[-1] == (
            f"qwenbot: another qwenbot run (pid {first.process.pid}) is serving the database "
            f"{tmp_path / 'bot.sqlite3'}; waited 1 s for it to stop")
        assert "Traceback" not in output

        ask(telegram_server, questions, 1, "and now?")  # the first one serves on, alone
        await telegram_server.wait_for(lambda: len(answers_by_question(telegram_server)) == 2, 30, "the answer")
        await telegram_server.settle(0.5)
        assert first.terminate() == 0
    finally:
        stop_all(first, *([second] if second else []))
    assert all(texts == [texts[0]] and texts[0].startswith("first run") for texts in
               answers_by_question(telegram_server).values())
    assert "Traceback" not in first.output()


async def test_a_rolling_restart_hands_over_without_answering_twice(telegram_server, tmp_path):
    questions: dict[tuple[int, int], int] = {}
    for round_ in range(3):
        for index, user in enumerate(USERS):
            ask(telegram_server, questions, index, f"{user.first_name} question {round_}")
    # Slow turns, so that many are in flight when the new process starts, and a short grace: the old process
    # stops the turns still waiting when it is told to stop, which leaves them to the new one.
    old = BotProcess(telegram_server, tmp_path, "old", {"SCRIPTED_DELAY_SECONDS": "2", "SHUTDOWN_GRACE_SECONDS": "0.5"})
    new = None
    try:
        await telegram_server.wait_for(lambda: len(answers_by_question(telegram_server)) >= len(USERS),
                                       START_SECONDS, "the first round of answers")
        new = BotProcess(telegram_server, tmp_path, "new", {"INSTANCE_LOCK_WAIT_SECONDS": "120"})
        await telegram_server.wait_for(lambda: "waiting up to 120 s" in new.output(), START_SECONDS,
                                       "the new process to wait for the old one")
        ask(telegram_server, questions, 0, "asked during the handover")
        assert await asyncio.to_thread(old.terminate) == 0
        await telegram_server.wait_for(lambda: len(answers_by_question(telegram_server)) == len(questions),
                                       START_SECONDS, "every question to be answered")
        await telegram_server.settle(1.0)
        assert await asyncio.to_thread(new.terminate) == 0
    finally:
        stop_all(old, *([new] if new else []))
    assert "Traceback" not in old.output() + new.output()

    answers = answers_by_question(telegram_server)
    assert set(answers) == set(questions)
    twice = {key: texts for key, texts in answers.items() if len(texts) != 1}
    assert not twice, f"answered more than once: {twice}"
    assert {texts[0].split(" #")[0] for texts in answers.values()} == {"old", "new"}  # both served some
    with closing(database_state(tmp_path / "bot.sqlite3")) as conn:
        assert_intact(conn)
        assert_every_turn_whole_in_the_history(conn)
        answered = Counter(key for (key,) in conn.execute("SELECT source_key FROM turns WHERE status = 'answered'"))
        assert len(answered) == len(questions) and set(answered.values()) == {1}
        assert conn.execute("SELECT count(*) FROM telegram_updates WHERE handled_at IS NULL").fetchone() == (0,)
