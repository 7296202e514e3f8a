"""LOG_FORMAT=json: one JSON object per line, and the same redaction of secrets as the plain format
(bot/program/logs.py), in-process and in a real `qwenbot run`."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from bot.program.config import ConfigError, Settings
from bot.program.logs import REDACTED, configure_logging
from tests.fakes.telegram_bot import ALICE, final, private_chat
from tests.fakes.telegram_server import FakeTelegramServer
from tests.test_security import REAL_LOOKING_TOKEN, restored_logging, token_variants

__all__ = ["restored_logging"]  # the fixture, used by name

ROOT = Path(__file__).resolve().parent.parent


def json_lines(output: str) -> list[dict]:
    """Every line of `output` as a JSON object (a line that is not one fails the test, naming it)."""
    entries = []
    for line in output.splitlines():
        try:
            entries.append(json.loads(line))
        except ValueError:
            pytest.fail(f"a log line that is not JSON: {line!r}")
    return entries


async def test_json_lines_carry_time_level_logger_message_and_traceback_with_secrets_redacted(
        restored_logging, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)  # basicConfig writes to the stderr of the moment
    api_key = "sk-another-secret-api-key"
    configure_logging("DEBUG", secrets=[REAL_LOOKING_TOKEN, api_key], log_format="json")
    logging.getLogger("httpx").setLevel(logging.DEBUG)

    with FakeTelegramServer(token=REAL_LOOKING_TOKEN) as server:
        async with httpx.AsyncClient() as client:
            await client.get(f"{server.base_url}{server.token}/getMe")  # httpx logs the URL, token and all
    log = logging.getLogger("bot.test")
    log.error("calling with %s and key %s\nand a second line", REAL_LOOKING_TOKEN, api_key)
    try:
        raise RuntimeError(f"request to https://api.telegram.org/bot{REAL_LOOKING_TOKEN}/getMe failed")
    except RuntimeError:
        log.exception("a failure 大模型")
    log.warning("stack of %s", api_key, stack_info=True)

    output = stream.getvalue()
    entries = json_lines(output)
    assert len(entries) == len(output.splitlines()) >= 4
    request = next(entry for entry in entries if entry["logger"] == "httpx")
    assert request["message"].startswith("HTTP Request: GET") and REDACTED in request["message"]
    error = next(entry for entry in entries if entry["message"].startswith("calling with"))
    assert error["level"] == "ERROR" and error["message"] == f"calling with {REDACTED} and key {REDACTED}\nand a " \
                                                              f"second line"
    assert error["time"].endswith("+00:00")
    failure = next(entry for entry in entries if entry["message"] == "a failure 大模型")
    assert "Traceback" in failure["exception"] and REDACTED in failure["exception"]
    assert "a failure 大模型" in output  # Chinese stays readable, not \u-escaped
    stacked = next(entry for entry in entries if entry["message"] == f"stack of {REDACTED}")
    assert "Stack (most recent call last)" in stacked["stack"]
    for secret in [*token_variants(REAL_LOOKING_TOKEN), api_key]:
        assert secret not in output, secret


def test_an_unknown_log_format_is_refused_naming_the_variable():
    with pytest.raises(ConfigError, match="LOG_FORMAT must be one of text, json, got 'xml'"):
        Settings.from_env({"LOG_FORMAT": "xml"})


async def test_a_real_run_with_log_format_json_writes_only_json_lines_and_never_the_token(tmp_path):
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps([final("the answer")]), encoding="utf-8")
    with FakeTelegramServer(token=REAL_LOOKING_TOKEN) as server:
        server.fail("getUpdates", status=502, description=f"Bad Gateway for /bot{server.token}/getUpdates", times=1)
        env = {**os.environ, "TELEGRAM_BOT_TOKEN": server.token, "TELEGRAM_BASE_URL": server.base_url,
               "LLM_BACKEND": "scripted", "SCRIPTED_REPLIES_PATH": str(replies), "LOG_LEVEL": "DEBUG",
               "LOG_FORMAT": "json", "DATABASE_PATH": str(tmp_path / "run.sqlite3"),
               "ALLOWED_USER_IDS": str(ALICE.id), "TOKENIZER_VOCAB_PATH": str(tmp_path / "absent.tiktoken"),
               "PYTHONPATH": str(ROOT)}
        with open(tmp_path / "stderr", "w") as stderr:
            process = subprocess.Popen([sys.executable, "-m", "bot.program.cli", "run"], cwd=tmp_path, env=env,
                                       stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            server.send_text(private_chat(ALICE), ALICE, "hello")
            await server.wait_for(lambda: server.sent_texts(ALICE.id), 60, "the answer")
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
        finally:
            process.kill()
    output = (tmp_path / "stderr").read_text(encoding="utf-8")
    assert process.returncode == 0, output
    entries = json_lines(output)
    messages = [entry["message"] for entry in entries]
    assert any(message.startswith("starting the bot") for message in messages) and "stopped" in messages
    assert any("getting updates failed" in message for message in messages)  # the failure was logged, redacted
    assert REDACTED in output
    for secret in token_variants(REAL_LOOKING_TOKEN):
        assert secret not in output, secret
