"""Webhook mode: a small tornado server that takes Telegram's posts into the update journal.

python-telegram-bot's own webhook server (`Updater.start_webhook`) reads a request's whole body before it looks at
the secret token, and accepts bodies up to tornado's default of 100 MB: anyone who can reach the port can make the
bot buffer that much per connection. It has no setting for either, and PTB documents running your own web server
instead (`ApplicationBuilder().updater(None)`, as bot/telegram/app.py does). This one streams the body
(`tornado.web.stream_request_body`), so the secret token (compared in constant time) and the declared length are
checked as soon as the headers arrive, before a byte of the body is read; no body, chunked or not, may exceed
WEBHOOK_MAX_BODY_BYTES. An update is journaled before the 200 goes back, so Telegram sends again whatever the bot
could not write.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from typing import Any, Awaitable, Callable
from urllib.parse import urlparse

import tornado.web
from telegram import Bot, Update
from tornado.httpserver import HTTPServer

log = logging.getLogger(__name__)

SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"

Accept = Callable[[Update], Awaitable[None]]


class WebhookServer:
    """Listens on `listen:port` at the path of `url`, registers `url` with Telegram, and hands each update to
    `accept` (which journals it)."""

    def __init__(self, bot: Bot, accept: Accept, *, url: str, listen: str, port: int, secret: str,
                 max_body_bytes: int, allowed_updates: list[str]):
        self.bot = bot
        self.accept = accept
        self.url = url
        self.listen = listen
        self.port = port
        self.secret = secret
        self.max_body_bytes = max_body_bytes
        self.allowed_updates = allowed_updates

    async def run(self) -> None:
        """Serve until cancelled; a webhook Telegram refuses to set (a rejected token) ends it with that error."""
        path = re.escape("/" + urlparse(self.url).path.lstrip("/").rstrip("/"))
        application = tornado.web.Application([(f"{path}/?", UpdateHandler, {"server": self})],
                                              log_function=lambda handler: None)  # our logging, not tornado's
        # As python-telegram-bot does: register first (a rejected token never opens the port), then listen.
        await self.bot.set_webhook(self.url, allowed_updates=self.allowed_updates, secret_token=self.secret,
                                   drop_pending_updates=False)
        http = HTTPServer(application, max_body_size=self.max_body_bytes)
        http.listen(self.port, address=self.listen)
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            http.stop()
            await http.close_all_connections()


@tornado.web.stream_request_body
class UpdateHandler(tornado.web.RequestHandler):
    """One POST from Telegram: an update as JSON."""

    SUPPORTED_METHODS = ("POST",)  # type: ignore[assignment]

    def initialize(self, server: WebhookServer) -> None:
        self.server = server
        self.body = bytearray()

    def prepare(self) -> None:
        """Only the headers have arrived: refuse a wrong secret, or a body declared too large, before reading it."""
        given = self.request.headers.get(SECRET_HEADER, "")
        if not hmac.compare_digest(given.encode("utf-8", "replace"), self.server.secret.encode("utf-8")):
            raise tornado.web.HTTPError(403, reason="wrong secret token")
        declared = self.request.headers.get("Content-Length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.server.max_body_bytes):
            raise tornado.web.HTTPError(413, reason="body too large")
        self.request.connection.set_max_body_size(self.server.max_body_bytes)  # a chunked body too

    def data_received(self, chunk: bytes) -> None:
        """A piece of the body (only after `prepare` let the request through)."""
        if not self._finished:
            self.body += chunk

    async def post(self) -> None:
        """Read the update, journal it, then answer 200 (500 when it could not be journaled: Telegram retries)."""
        try:
            data = json.loads(self.body)
        except ValueError:
            raise tornado.web.HTTPError(400, reason="not JSON") from None
        try:
            update = Update.de_json(data, self.server.bot)
        except Exception as error:  # one Telegram cannot be read: skipped (as in polling), not retried forever
            log.error("webhook update %s cannot be read (%s); skipping it",
                      data.get("update_id") if isinstance(data, dict) else "?", error)
            return
        if update is None:
            return
        try:
            await self.server.accept(update)
        except Exception as error:  # the database busy or gone: not journaled, so not confirmed
            log.error("could not journal webhook update %s: %s", update.update_id, error)
            self.send_error(500)

    def write_error(self, status_code: int, **kwargs: object) -> None:
        """A bare status line: nothing about the server for whoever is probing it."""
        self.finish()

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        """Refusals at debug level (tornado warns about each, and a prober could fill the log); the rest as errors."""
        if isinstance(value, tornado.web.HTTPError):
            log.debug("webhook %s from %s: %s", value.status_code, self.request.remote_ip, value.reason)
        else:
            log.error("webhook request failed", exc_info=(typ, value, tb))
