"""Every Bot API call, counted by method and result, and when Telegram last answered (for /metrics and /healthz).

python-telegram-bot sends every call through one `BaseRequest.do_request`; `MeteredRequest` is its HTTPX
implementation with a tally around that call, so flood waits (429), server errors (5xx) and network failures are
seen whatever handler or library path made the call. The tally (`TelegramCalls`) is plain counters: the program
around the adapter (bot/program/metrics.py) reads them at scrape time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from telegram import Bot
from telegram.error import NetworkError, TelegramError, TimedOut
from telegram.request import HTTPXRequest

log = logging.getLogger(__name__)

# python-telegram-bot's own pool sizes (ApplicationBuilder): many calls at once, one long poll.
CALLS_POOL_SIZE = 256
UPDATES_POOL_SIZE = 1


def result_of(status: int) -> str:
    """The `result` label of an HTTP status: ok, 429 (a flood wait), 4xx, 5xx."""
    if 200 <= status < 300:
        return "ok"
    if status == 429:
        return "429"
    return "4xx" if status < 500 else "5xx"


def method_of(url: str) -> str:
    """The Bot API method a URL calls (`…/bot<token>/sendMessage` → sendMessage); never the token."""
    if "/file/bot" in url:
        return "file"
    return url.rstrip("/").rsplit("/", 1)[-1].split("?", 1)[0]


class TelegramCalls:
    """Bot API calls by (method, result), and when Telegram last answered at all (below 500: it was reached)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.last_reached: float | None = None  # time.monotonic() of the last answer from Telegram itself

    def record(self, method: str, result: str, reached: bool) -> None:
        """One call ended with `result`; `reached` when Telegram (not a proxy or the network) answered it."""
        self.counts[(method, result)] += 1
        if reached:
            self.last_reached = time.monotonic()

    def seconds_since_reached(self) -> float | None:
        """Seconds since Telegram last answered; None when it never has."""
        return None if self.last_reached is None else time.monotonic() - self.last_reached


class MeteredRequest(HTTPXRequest):
    """python-telegram-bot's HTTPX request layer, each call tallied in `calls`."""

    def __init__(self, calls: TelegramCalls, **kwargs: Any):
        super().__init__(**kwargs)
        self.calls = calls

    async def do_request(self, url: str, method: str, *args: Any, **kwargs: Any) -> tuple[int, bytes]:
        api_method = method_of(url)
        try:
            status, payload = await super().do_request(url, method, *args, **kwargs)
        except TimedOut:
            self.calls.record(api_method, "timeout", reached=False)
            raise
        except NetworkError:
            self.calls.record(api_method, "network_error", reached=False)
            raise
        self.calls.record(api_method, result_of(status), reached=status < 500)
        return status, payload


async def keep_in_touch(bot: Bot, calls: TelegramCalls, every: float) -> None:
    """Ask Telegram `getMe` whenever nothing has reached it for `every` seconds, so that /healthz knows it is
    reachable while the bot is idle (a webhook bot calls nothing until a message comes). Runs until cancelled."""
    while True:
        await asyncio.sleep(every)
        since = calls.seconds_since_reached()
        if since is None or since >= every:
            try:
                await bot.get_me()
            except TelegramError as error:  # counted by the request layer; /healthz reports it
                log.info("Telegram did not answer getMe: %s", error)
