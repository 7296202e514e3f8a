"""Delivery: every update answered at least once and at most once per turn, across shutdowns and restarts; the
webhook mode; and `qwenbot run` as a process (SIGTERM, a rejected token)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.fakes.telegram_bot import ALICE, final, private_chat, start_bot, telegram_server
from tests.fakes.telegram_server import FakeTelegramServer

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

ROOT = Path(__file__).resolve().parent.parent


async def test_an_update_sent_again_after_a_restart_is_not_answered_twice(start_bot, telegram_server):
    first = await start_bot([final("the answer")])
    assert await first.ask(private_chat(ALICE), ALICE, "question") == "the answer"
    await first.stop()

    telegram_server.redeliver(1)  # Telegram never saw the confirmation
    second = await start_bot([final("must not be used")])
    await telegram_server.wait_for(lambda: telegram_server.pending_updates == [])
    await telegram_server.settle()
    assert telegram_server.sent_texts(ALICE.id) == ["the answer"]
    assert second.llm.requests == []
    assert await second.query("SELECT count(*) FROM turns") == [(1,)]


async def test_a_turn_stopped_by_shutdown_is_answered_after_the_restart(start_bot, telegram_server):
    first = await start_bot([final("too slow")], delay=30)
    telegram_server.send_text(private_chat(ALICE), ALICE, "a long question")
    await telegram_server.wait_for(lambda: first.llm.requests, message="the model to start")
    await first.stop()  # within stop()'s 15 s, not the model's 30: grace 0.5 s, then the generation is cancelled
    assert telegram_server.sent_texts(ALICE.id) == []
    assert await first.query("SELECT update_id FROM telegram_updates WHERE handled_at IS NULL") == [(1,)]

    second = await start_bot([final("answered after the restart")])
    assert await second.answers(ALICE.id, 1) == ["answered after the restart"]
    assert "a long question" in second.llm.requests[0].text
    assert await second.query("SELECT status FROM turns ORDER BY id") == [("cancelled",), ("answered",)]
    await second.all_handled()


async def test_a_turn_that_finishes_within_the_grace_period_is_delivered(start_bot, telegram_server):
    bot = await start_bot([final("just in time")], delay=0.3, shutdown_grace_seconds=5)
    telegram_server.send_text(private_chat(ALICE), ALICE, "quick one")
    await telegram_server.wait_for(lambda: bot.llm.requests)
    await bot.stop()
    assert telegram_server.sent_texts(ALICE.id) == ["just in time"]


async def test_a_stored_answer_that_was_never_marked_sent_is_sent_again_without_the_model(start_bot,
                                                                                          telegram_server):
    first = await start_bot([final("stored answer")])
    await first.ask(private_chat(ALICE), ALICE, "question")
    await first.stop()
    # As if the process died after storing the turn and before Telegram took the answer (so nothing recorded it
    # as delivered, nor the update as handled, which is when the journal keeps the update whole, not its husk).
    db = await first.query("UPDATE telegram_updates SET handled_at = NULL, payload = ? RETURNING update_id",
                           (json.dumps(telegram_server.pushed(1)),))
    assert db == [(1,)]
    assert await first.query("DELETE FROM answer_deliveries RETURNING piece") == [(0,)]

    second = await start_bot()
    assert await second.answers(ALICE.id, 2) == ["stored answer", "stored answer"]
    assert second.llm.requests == []
    assert await second.query("SELECT count(*) FROM turns") == [(1,)]


async def test_a_stored_answer_recorded_as_delivered_is_not_sent_again_after_a_restart(start_bot, telegram_server):
    first = await start_bot([final("stored answer")])
    await first.ask(private_chat(ALICE), ALICE, "question")
    await first.stop()
    # As if the process died after Telegram took the answer (recorded) and before the update was marked handled.
    assert await first.query("UPDATE telegram_updates SET handled_at = NULL, payload = ? RETURNING update_id",
                             (json.dumps(telegram_server.pushed(1)),)) == [(1,)]

    second = await start_bot()
    await second.all_handled()
    await telegram_server.settle()
    assert telegram_server.sent_texts(ALICE.id) == ["stored answer"]
    assert second.llm.requests == []


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_webhook_mode_answers_updates_posted_with_the_secret_and_refuses_others(start_bot, telegram_server):
    port = free_port()
    url = f"http://127.0.0.1:{port}/telegram-hook"
    bot = await start_bot([final("via webhook")], webhook_url=url, webhook_port=port,
                          webhook_secret_token="s3cret-token")
    set_webhook = telegram_server.calls_to("setWebhook", ok=True)[0].params
    assert set_webhook["url"] == url and set_webhook["secret_token"] == "s3cret-token"
    assert telegram_server.polls_started == 0

    update = {"update_id": 500, "message": {
        "message_id": 1, "date": int(time.time()), "chat": {"id": ALICE.id, "type": "private", "first_name": "A"},
        "from": {"id": ALICE.id, "is_bot": False, "first_name": "Alice", "language_code": "zh"}, "text": "hello"}}
    async with httpx.AsyncClient() as client:
        refused = await client.post(url, json=update, headers={"X-Telegram-Bot-Api-Secret-Token": "wrong"})
        assert refused.status_code == 403
        accepted = await client.post(url, json=update, headers={"X-Telegram-Bot-Api-Secret-Token": "s3cret-token"})
        assert accepted.status_code == 200
    assert await bot.answers(ALICE.id, 1) == ["via webhook"]
    assert await bot.query("SELECT source_key FROM turns") == [(bot.source_key(500),)]


def run_cli(server: FakeTelegramServer, tmp_path: Path, token: str) -> subprocess.Popen:
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps([final("from the real process")]), encoding="utf-8")
    env = {**os.environ, "TELEGRAM_BOT_TOKEN": token, "TELEGRAM_BASE_URL": server.base_url,
           "LLM_BACKEND": "scripted", "SCRIPTED_REPLIES_PATH": str(replies),
           "DATABASE_PATH": str(tmp_path / "cli.sqlite3"), "ALLOWED_USER_IDS": str(ALICE.id),
           "TOKENIZER_VOCAB_PATH": str(tmp_path / "absent.tiktoken"), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "bot.program.cli", "run"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def test_qwenbot_run_answers_and_stops_cleanly_on_sigterm(telegram_server, tmp_path):
    process = run_cli(telegram_server, tmp_path, telegram_server.token)
    try:
        telegram_server.send_text(private_chat(ALICE), ALICE, "hello")
        await telegram_server.wait_for(lambda: telegram_server.sent_texts(ALICE.id), 30, "the process to answer")
        assert telegram_server.sent_texts(ALICE.id) == ["from the real process"]
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert telegram_server.token not in stderr and "Traceback" not in stderr


async def test_qwenbot_run_with_a_rejected_token_says_so_in_one_line(telegram_server, tmp_path):
    process = run_cli(telegram_server, tmp_path, "999999:not-the-token-the-server-knows-about-xxxxx")
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 2
    assert stderr.strip().splitlines()[-1] == \
        "qwenbot: Telegram refused TELEGRAM_BOT_TOKEN: check it with @BotFather"
    assert "not-the-token" not in stderr and "Traceback" not in stderr
