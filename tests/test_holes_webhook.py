"""Webhook mode under abuse (issue 13): the secret token is checked, and the body's declared size capped, before a
byte of the body is read; a chunked body cannot grow past WEBHOOK_MAX_BODY_BYTES either; and the bot goes on
answering Telegram's real posts.

Requests are written by hand on a raw socket: for the abuse, the test sends the headers of a 90 MB body and none
of the body. A server that checks the headers first answers at once; one that reads the body first (as
python-telegram-bot's own server does) waits for a body that never comes, and never answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time

import pytest

from tests.fakes.telegram_bot import ALICE, final, running_bot, telegram_server

__all__ = ["telegram_server"]  # the fixture, used by name

SECRET = "s3cret-token"
MAX_BODY = 64 * 1024
HUGE = 90_000_000  # the probe's 90 MB
# Not a time limit on the bot: how long a test waits for an answer that a server reading the body first would
# never give (it waits for the 90 MB that never come).
ANSWER_WAIT_SECONDS = 30


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def update_json(update_id: int, text: str) -> bytes:
    """A private message from Alice, as Telegram posts it."""
    return json.dumps({"update_id": update_id, "message": {
        "message_id": update_id, "date": int(time.time()), "chat": {"id": ALICE.id, "type": "private",
                                                                     "first_name": "Alice"},
        "from": {"id": ALICE.id, "is_bot": False, "first_name": "Alice", "language_code": "zh"},
        "text": text}}).encode()


def exchange(port: int, head: str, body: bytes = b"") -> bytes:
    """Send the request head and `body`, and read the answer until the server hangs up (every request says
    `Connection: close`); b"" when none comes within ANSWER_WAIT_SECONDS."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WAIT_SECONDS) as sock:
        sock.sendall(head.encode("latin-1") + b"\r\n" + body)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:  # the server hung up with some of our bytes unread: what came before counts
            pass
        except TimeoutError:  # still waiting for the rest of a body we never send: no answer
            pass
    return answer


def request_head(path: str, port: int, *, length: int | None = None, secret: str | None = None,
                 chunked: bool = False) -> str:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json",
             "Connection: close"]
    if secret is not None:
        lines.append(f"X-Telegram-Bot-Api-Secret-Token: {secret}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return "\r\n".join(lines) + "\r\n"


def status_of(answer: bytes) -> int | None:
    """The HTTP status of the answer; None when the server hung up without one."""
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


@pytest.fixture
async def hooked(telegram_server, tmp_path):
    """The bot in webhook mode with a 64 KiB body cap; yields (bot, port, path)."""
    port = free_port()
    bot = await running_bot(telegram_server, tmp_path, [final("via webhook")] * 3,
                            webhook_url=f"http://127.0.0.1:{port}/hook", webhook_port=port,
                            webhook_secret_token=SECRET, webhook_max_body_bytes=MAX_BODY)
    yield bot, port, "/hook"
    await bot.stop()


async def journaled(bot) -> list[tuple]:
    return await bot.query("SELECT update_id FROM telegram_updates")


@pytest.mark.parametrize("secret", [None, "", "wrong", SECRET + "x"])
async def test_a_wrong_secret_is_refused_before_the_body_is_read(hooked, secret, caplog):
    bot, port, path = hooked
    head = request_head(path, port, length=HUGE, secret=secret)
    answer = await asyncio.to_thread(exchange, port, head)  # none of the 90 MB
    assert status_of(answer) == 403, answer[:200]
    assert await journaled(bot) == []
    # A prober is not worth a warning per request: the log would be theirs to fill.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_body_declared_larger_than_the_cap_is_refused_before_it_is_read(hooked):
    bot, port, path = hooked
    head = request_head(path, port, length=HUGE, secret=SECRET)
    answer = await asyncio.to_thread(exchange, port, head)
    assert status_of(answer) == 413, answer[:200]
    assert await journaled(bot) == []


async def test_a_chunked_body_that_grows_past_the_cap_is_cut_off_and_not_journaled(hooked):
    bot, port, path = hooked
    body = update_json(7, "x" * (2 * MAX_BODY))  # a well-formed update, just too big
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in
                      (body[i:i + 8192] for i in range(0, len(body), 8192))) + b"0\r\n\r\n"
    answer = await asyncio.to_thread(exchange, port, request_head(path, port, secret=SECRET, chunked=True), chunks)
    assert status_of(answer) != 200, answer[:200]
    assert await journaled(bot) == [] and bot.llm.requests == []


async def test_telegrams_own_posts_are_still_answered_after_the_abuse(hooked):
    bot, port, path = hooked
    for secret in (None, "wrong"):
        await asyncio.to_thread(exchange, port, request_head(path, port, length=HUGE, secret=secret))
    body = update_json(8, "hello")
    answer = await asyncio.to_thread(exchange, port, request_head(path, port, length=len(body), secret=SECRET), body)
    assert status_of(answer) == 200, answer[:200]
    assert await bot.answers(ALICE.id, 1) == ["via webhook"]
    assert await journaled(bot) == [(8,)]


async def test_a_body_of_exactly_the_cap_is_accepted(hooked):
    bot, port, path = hooked
    body = update_json(9, "y" * (MAX_BODY - len(update_json(9, ""))))  # exactly at the cap
    assert len(body) == MAX_BODY
    answer = await asyncio.to_thread(exchange, port, request_head(path, port, length=len(body), secret=SECRET), body)
    assert status_of(answer) == 200, answer[:200]
    assert await journaled(bot) == [(9,)]


def test_the_body_cap_must_be_positive():
    from bot.program.config import ConfigError, Settings

    with pytest.raises(ConfigError, match="^WEBHOOK_MAX_BODY_BYTES must be greater than 0"):
        Settings.from_env({"WEBHOOK_MAX_BODY_BYTES": "0"})
