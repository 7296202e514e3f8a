"""Logging set-up: plain lines or one JSON object a line (LOG_FORMAT), quiet HTTP libraries, and secrets that never
reach a log line in either format.

httpx logs every request URL at INFO, and a Bot API URL holds the bot token (`/bot<TOKEN>/getUpdates`), so
the token is redacted from every record, whatever logger or exception text carries it. MCP header values are
secrets too: the ones the bot knows join the filter at run time (`add_secrets`), and an `/mcp_add` command, which
carries them before anyone has read it (python-telegram-bot and aiosqlite log raw updates at DEBUG), loses
everything after its URL.
"""

from __future__ import annotations

import json
import logging
import re
from datetime import datetime, timezone
from typing import Iterable

# What a Telegram token looks like, for tokens that reach a log some other way than through Settings.
_TOKEN_SHAPE = re.compile(r"\d{6,12}:[A-Za-z0-9_-]{30,}")
# `/mcp_add NAME URL Header=value…`: the headers are whatever follows the URL.
_MCP_ADD = re.compile(r"(/mcp_add(?:@\w+)?[ \t]+\S+[ \t]+[^\s\\\"']+)[^\n]*")
REDACTED = "[REDACTED]"
LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_REDACTORS: list["RedactSecrets"] = []  # every installed filter, so secrets met at run time reach them all


def redact_token_shapes(text: str) -> str:
    """`text` with anything shaped like a bot token replaced: for messages that show a value someone typed."""
    return _TOKEN_SHAPE.sub(REDACTED, text)


class RedactSecrets(logging.Filter):
    """Replace each secret (and anything shaped like a bot token) in a record's final text."""

    def __init__(self, secrets: Iterable[str] = ()):
        super().__init__()
        self.secrets: list[str] = []
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        """Redact `secrets` too (values shorter than 6 characters are too common to replace)."""
        self.secrets = sorted({*self.secrets, *(s for s in secrets if s and len(s) >= 6)}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """`text` with every secret replaced."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return _MCP_ADD.sub(rf"\1 {REDACTED}", redact_token_shapes(text))

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
    """Put one secret-redacting filter on `handlers` (and remember it for `add_secrets`)."""
    redactor = RedactSecrets(secrets)
    _REDACTORS.append(redactor)
    for handler in handlers:
        handler.addFilter(redactor)
    return redactor


def add_secrets(secrets: Iterable[str]) -> None:
    """Secrets learnt at run time (MCP header and environment values) join every installed filter."""
    values = list(secrets)
    for redactor in _REDACTORS:
        redactor.add(values)
