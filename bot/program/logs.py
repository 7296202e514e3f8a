"""Logging set-up: plain lines or one JSON object a line (LOG_FORMAT), quiet HTTP libraries, and secrets that never
reach a log line in either format.

httpx logs every request URL at INFO, and a Bot API URL holds the bot token (`/bot<TOKEN>/getUpdates`), so every
record is redacted through the process's one set of secrets (core/secrets.py), whatever logger or exception text
carries it: the token, the webhook secret (python-telegram-bot logs `setWebhook`'s parameters at DEBUG), API
keys, URL credentials, MCP header values. Secrets met at run time join the same set (`add_secrets`). An
`/mcp_add` command, which carries its secrets before anyone has read it (python-telegram-bot and aiosqlite log raw
updates at DEBUG), also loses everything after its URL.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timezone
from typing import Iterable

from core.secrets import REDACTED, SECRETS, remember_secrets

__all__ = ["LOG_FORMATS", "REDACTED", "JsonFormatter", "RedactSecrets", "add_secrets", "configure_logging",
           "redact_handlers", "redact_token_shapes"]

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_TOKEN_SHAPE = re.compile(r"\d{6,12}:[A-Za-z0-9_-]{30,}")
# `/mcp_add NAME URL Header=value…`: the headers are whatever follows the URL.
_MCP_ADD = re.compile(r"(/mcp_add(?:@\w+)?[ \t]+\S+[ \t]+[^\s\\\"']+)[^\n]*")


def redact_token_shapes(text: str) -> str:
    """`text` with anything shaped like a bot token replaced: for messages that show a value someone typed."""
    return _TOKEN_SHAPE.sub(REDACTED, text)


class RedactSecrets(logging.Filter):
    """Replace every known secret (and anything shaped like a bot token) in a record's final text."""

    def __init__(self, secrets: Iterable[str] = ()):
        super().__init__()
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        """Redact `secrets` too (everywhere: the set is the process's one)."""
        remember_secrets(secrets)

    def redact(self, text: str) -> str:
        """`text` with every secret replaced."""
        return _MCP_ADD.sub(rf"\1 {REDACTED}", SECRETS.redact(text))

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args = self.redact(message), None
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a line, for log collectors: time (UTC, ISO 8601), level, logger, message, and the traceback
    as `exception` when there is one. It formats what the handler's filters left, so secrets are redacted already."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
                 "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, secrets: Iterable[str] = (), log_format: str = "text") -> None:
    """Log to stderr at `level`, as plain lines or JSON objects (`log_format`), with secrets redacted on every
    handler."""
    logging.basicConfig(level=level.upper(), format=TEXT_FORMAT, force=True)
    if log_format == "json":
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
    redact_handlers(logging.getLogger().handlers, secrets)
    # Request lines are noise at INFO and carry the token in their URL; warnings still show. (httpx2 is the MCP
    # SDK's HTTP client.)
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


def redact_handlers(handlers: Iterable[logging.Handler], secrets: Iterable[str] = ()) -> RedactSecrets:
    """Put one secret-redacting filter on `handlers`."""
    redactor = RedactSecrets(secrets)
    for handler in handlers:
        handler.addFilter(redactor)
    return redactor


def add_secrets(secrets: Iterable[str]) -> None:
    """Secrets learnt at run time (MCP header and environment values) join the one set every filter reads."""
    remember_secrets(secrets)
