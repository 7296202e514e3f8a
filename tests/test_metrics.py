"""/metrics and /healthz of a running bot (METRICS_PORT), its `qwenbot health` command and systemd's watchdog.

The bot is the real application against the fake Bot API server, with a scripted model; the endpoint is read over
real HTTP and /metrics parsed with prometheus_client's own parser, as Prometheus would read it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.program.cli import main
from bot.telegram.requests import method_of, result_of
from db import open_database
from tests.fakes.telegram_bot import (ALICE, ARTICLE_QUESTION, QWEN_FINAL, QWEN_LOOKUP, final, private_chat,
                                      running_bot, telegram_server)

__all__ = ["telegram_server"]  # the fixture, used by name

FAMILIES = {
    "qwenbot_turns", "qwenbot_turn_duration_seconds", "qwenbot_first_visible_seconds", "qwenbot_tool_calls",
    "qwenbot_model_queue_jobs", "qwenbot_model_batch_rows", "qwenbot_model_batches", "qwenbot_model_batched_rows",
    "qwenbot_model_generated_tokens", "qwenbot_model_prompt_tokens", "qwenbot_model_speculative_tokens",
    "qwenbot_telegram_requests", "qwenbot_update_journal_backlog", "qwenbot_mcp_server_state",
    "qwenbot_mcp_server_tools",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[str, dict[tuple, float]]:
    """/metrics parsed: family name → {(sample name, sorted labels): value}."""
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert response.status_code == 200
    return {family.name: {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
            for family in text_string_to_metric_families(response.text)}


def value(families: dict, family: str, sample: str | None = None, **labels: str) -> float:
    return families[family][(sample or family, tuple(sorted(labels.items())))]


def healthz(port: int) -> tuple[int, dict]:
    response = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30)
    return response.status_code, response.json()


@contextmanager
def read_only(path: Path):
    """`path` write-protected for this process: mode 0444, and for root the immutable attribute too."""
    mode = path.stat().st_mode
    path.chmod(0o444)
    immutable = os.geteuid() == 0
    if immutable:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(mode)


async def add_unreachable_mcp_server(tmp_path: Path) -> None:
    """An admin-added MCP server nobody serves: the bot lists it, down."""
    db = await open_database(tmp_path / "bot.sqlite3")
    async with db.transaction() as conn:
        await conn.execute("INSERT INTO mcp_servers (name, transport, url) VALUES ('files', 'http', ?)",
                           (f"http://127.0.0.1:{free_port()}/mcp",))
    await db.close()


async def test_metrics_expose_every_family_after_a_scripted_turn(telegram_server, tmp_path):
    await add_unreachable_mcp_server(tmp_path)
    telegram_server.fail("setMyCommands", status=502, times=1)
    telegram_server.fail("sendChatAction", status=429, retry_after=0.1, times=1)
    port = free_port()
    bot = await running_bot(telegram_server, tmp_path, [QWEN_LOOKUP, QWEN_FINAL], token_seconds=0.05,
                            metrics_port=port, typing_interval_seconds=0.2)
    try:
        answer = await bot.ask(private_chat(ALICE), ALICE, ARTICLE_QUESTION)
        await bot.turns_done()
        await bot.all_handled()
        families = await asyncio.to_thread(scrape, port)
    finally:
        await bot.stop()
    assert "200" in answer
    assert FAMILIES <= set(families), f"missing: {FAMILIES - set(families)}"
    assert value(families, "qwenbot_turns", "qwenbot_turns_total", status="answered") == 1
    assert value(families, "qwenbot_turn_duration_seconds", "qwenbot_turn_duration_seconds_count") == 1
    assert value(families, "qwenbot_first_visible_seconds", "qwenbot_first_visible_seconds_count") == 1
    # The answer first showed before the turn was over.
    assert (value(families, "qwenbot_first_visible_seconds", "qwenbot_first_visible_seconds_sum")
            <= value(families, "qwenbot_turn_duration_seconds", "qwenbot_turn_duration_seconds_sum"))
    assert value(families, "qwenbot_tool_calls", "qwenbot_tool_calls_total", tool="course_query", outcome="ok") == 1
    telegram = families["qwenbot_telegram_requests"]
    assert telegram[("qwenbot_telegram_requests_total", (("method", "setMyCommands"), ("result", "5xx")))] == 1
    assert telegram[("qwenbot_telegram_requests_total", (("method", "sendChatAction"), ("result", "429")))] == 1
    assert telegram[("qwenbot_telegram_requests_total", (("method", "getUpdates"), ("result", "ok")))] >= 1
    assert not any(telegram_server.token in label for (_, labels) in telegram for _, label in labels)
    # The scripted model counts the tokens of its two replies; it has no queue, batches or speculative tokens.
    assert value(families, "qwenbot_model_generated_tokens", "qwenbot_model_generated_tokens_total") > 0
    assert value(families, "qwenbot_model_prompt_tokens", "qwenbot_model_prompt_tokens_total", cache="computed") > 0
    assert value(families, "qwenbot_model_speculative_tokens", "qwenbot_model_speculative_tokens_total",
                 outcome="accepted") == 0
    assert value(families, "qwenbot_model_queue_jobs") == 0
    assert value(families, "qwenbot_update_journal_backlog") == 0
    assert value(families, "qwenbot_mcp_server_tools", server="files") == 0
    states = {labels[1][1]: v for (_, labels), v in families["qwenbot_mcp_server_state"].items()}
    assert sum(states.values()) == 1 and states.keys() == {"connected", "connecting", "down", "idle"}


async def test_healthz_is_ok_and_turns_unhealthy_when_the_database_is_made_read_only(telegram_server, tmp_path):
    port = free_port()
    bot = await running_bot(telegram_server, tmp_path, [final("fine")], metrics_port=port)
    try:
        await bot.ask(private_chat(ALICE), ALICE, "hello")
        status, body = await asyncio.to_thread(healthz, port)
        assert (status, body["status"]) == (200, "ok"), body
        assert set(body["checks"]) == {"process", "event loop", "database", "model", "telegram"}
        assert all(check["ok"] for check in body["checks"].values())
        assert await bot.query("SELECT id FROM health_checks") == [(1,)]  # the write it made

        with read_only(bot.settings.storage.database_path):
            status, body = await asyncio.to_thread(healthz, port)
        assert (status, body["status"]) == (503, "unhealthy")
        database = body["checks"]["database"]
        assert not database["ok"]
        assert database["detail"].startswith(f"{bot.settings.storage.database_path} is write-protected for this "
                                             f"process (mode 0444")
        assert all(check["ok"] for name, check in body["checks"].items() if name != "database")

        status, body = await asyncio.to_thread(healthz, port)  # writable again: healthy again
        assert status == 200, body
    finally:
        await bot.stop()


async def test_healthz_turns_unhealthy_while_the_event_loop_is_blocked(telegram_server, tmp_path):
    port = free_port()
    bot = await running_bot(telegram_server, tmp_path, [], metrics_port=port, health_check_timeout_seconds=0.5)
    try:
        answer: list = []
        asker = threading.Thread(target=lambda: answer.append(healthz(port)))
        asker.start()
        time.sleep(2.0)  # blocks the event loop itself, as a handler that never awaits would
        await asyncio.to_thread(asker.join, 30)
        status, body = answer[0]
    finally:
        await bot.stop()
    assert status == 503
    assert body["checks"]["event loop"] == {"ok": False, "detail": "did not answer within 0.5 s: every chat is frozen"}


async def test_healthz_says_telegram_is_unreachable_after_its_window(telegram_server, tmp_path):
    port = free_port()
    bot = await running_bot(telegram_server, tmp_path, [], metrics_port=port, health_telegram_seconds=1)
    try:
        telegram_server.fail("getUpdates", status=502, for_seconds=60)
        telegram_server.fail("getMe", status=502, for_seconds=60)
        await asyncio.sleep(2.5)
        status, body = await asyncio.to_thread(healthz, port)
    finally:
        await bot.stop()
    assert status == 503
    assert body["checks"]["telegram"]["detail"].startswith("last reached ")
    assert body["checks"]["telegram"]["detail"].endswith("s ago (HEALTH_TELEGRAM_SECONDS=1)")


async def test_qwenbot_health_asks_the_running_bot(logging_restored, telegram_server, tmp_path, monkeypatch,
                                                   capsys):
    port = free_port()
    bot = await running_bot(telegram_server, tmp_path, [], metrics_port=port)
    try:
        monkeypatch.setenv("METRICS_PORT", str(port))
        monkeypatch.setenv("DATA_DIR", str(tmp_path))
        assert await asyncio.to_thread(main, ["health"]) == 0
        assert json.loads(capsys.readouterr().out)["status"] == "ok"
    finally:
        await bot.stop()
    assert await asyncio.to_thread(main, ["health"]) == 1  # stopped: nothing answers
    assert capsys.readouterr().out.startswith(f"unhealthy: nothing answers at http://127.0.0.1:{port}/healthz")
    monkeypatch.setenv("METRICS_PORT", "0")
    assert main(["health"]) == 2
    assert "the health endpoint is off: set METRICS_PORT" in capsys.readouterr().err


async def test_a_port_in_use_stops_the_start_with_one_line(telegram_server, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(Exception) as refused:
            await running_bot(telegram_server, tmp_path, [], metrics_port=port)
    assert f"METRICS_PORT: cannot listen on 127.0.0.1:{port}" in str(refused.value)


async def test_systemd_hears_ready_and_watchdog_pings_only_while_healthy(telegram_server, tmp_path, monkeypatch):
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(tmp_path / "notify.sock"))
    listener.settimeout(10)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")  # WatchdogSec=0.4: a ping every 0.2 s while healthy
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    heard: list[str] = []

    def hear_until(wanted: str) -> None:
        while (message := listener.recv(1024).decode()) and not message.startswith(wanted):
            heard.append(message)
        heard.append(message)

    def hear_for(seconds: float) -> list[str]:
        messages, deadline = [], time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            listener.settimeout(left)
            try:
                messages.append(listener.recv(1024).decode())
            except TimeoutError:
                break
        listener.settimeout(10)
        return messages

    bot = await running_bot(telegram_server, tmp_path, [])
    try:
        await asyncio.to_thread(hear_until, "WATCHDOG=1")
        assert heard[0] == "READY=1"
        with read_only(bot.settings.storage.database_path):
            await asyncio.to_thread(hear_until, "STATUS=unhealthy")
            while_unhealthy = await asyncio.to_thread(hear_for, 1.0)
        await asyncio.to_thread(hear_until, "WATCHDOG=1")  # healthy again
    finally:
        await bot.stop()
        listener.close()
    assert "WATCHDOG=1" not in while_unhealthy and while_unhealthy  # checked every 0.2 s, never pinged
    assert all(message.startswith("STATUS=unhealthy: database: ") for message in while_unhealthy)


def test_the_method_label_never_holds_the_token_and_results_are_classes():
    assert method_of("https://api.telegram.org/bot123456:SECRET-token/sendMessage") == "sendMessage"
    assert method_of("https://api.telegram.org/file/bot123456:SECRET-token/photos/file_1.jpg") == "file"
    assert [result_of(code) for code in (200, 400, 403, 429, 500, 502)] == ["ok", "4xx", "4xx", "429", "5xx", "5xx"]


def test_the_grafana_dashboard_asks_only_for_metrics_the_bot_exposes():
    dashboard = json.loads((Path(__file__).resolve().parent.parent / "deploy" / "grafana-dashboard.json").read_text())
    asked = {re.sub(r"_(total|bucket|sum|count)$", "", name) for panel in dashboard["panels"]
             for target in panel["targets"] for name in re.findall(r"qwenbot_\w+", target["expr"])}
    assert asked and asked <= FAMILIES, asked - FAMILIES
