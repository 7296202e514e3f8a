"""Logging set-up: one format, quiet HTTP libraries, and secrets that never reach a log line.

httpx logs every request URL at INFO, and a Bot API URL holds the bot token (`/bot<TOKEN>/getUpdates`), so
the token is redacted from every record, whatever logger or exception text carries it.
"""

from __future__ import annotations

import logging
import re
from typing import Iterable

# What a Telegram token looks like, for tokens that reach a log some other way than through Settings.
_TOKEN_SHAPE = re.compile(r"\d{6,12}:[A-Za-z0-9_-]{30,}")
REDACTED = "[REDACTED]"


def redact_token_shapes(text: str) -> str:
    """`text` with anything shaped like a bot token replaced: for messages that show a value someone typed."""
    return _TOKEN_SHAPE.sub(REDACTED, text)


class RedactSecrets(logging.Filter):
    """Replace each secret (and anything shaped like a bot token) in a record's final text."""

    def __init__(self, secrets: Iterable[str] = ()):
        super().__init__()
        self.secrets = sorted({s for s in secrets if s and len(s) >= 6}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        """`text` with every secret replaced."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return redact_token_shapes(text)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args = self.redact(message), None
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        return True


def configure_logging(level: str, secrets: Iterable[str] = ()) -> None:
    """Log to stderr at `level`, with secrets redacted on every handler."""
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    redactor = RedactSecrets(secrets)
    for handler in logging.getLogger().handlers:
        handler.addFilter(redactor)
    # Request lines are noise at INFO and carry the token in their URL; warnings still show.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
