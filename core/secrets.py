"""The one redactor of secrets, by value: whatever text leaves the process passes through `redact`.

    remember_secrets([token, api_key])      # every source of secrets feeds it (settings, MCP servers, webhooks)
    redact(text)                            # each known secret, and anything shaped like a bot token, replaced

A secret is redacted by its value, wherever it turns up, not by the field it came in: a tool that echoes its
request's headers puts an MCP header value into its result, and only its value gives it away there. So the bot
token, the webhook secret, the OpenAI API key, MCP header and environment values and the credentials of every
configured URL join this one set, and the registry's output (before the model sees it), answers, traces, stored
rows, Telegram messages and log lines are all redacted through it.

The set is one per process and only grows: a secret once known stays redacted until the process ends (a server
removed may have echoed its header into a history that is shown later).
"""

from __future__ import annotations

import base64
import json
import re
import threading
from typing import Iterable
from urllib.parse import parse_qsl, quote, urlsplit

REDACTED = "[REDACTED]"
# Shorter values are too common to replace everywhere ("admin", "1234"): they are not worth a false match.
MIN_SECRET_CHARS = 6
# What a Telegram bot token looks like, for tokens that reach a text some other way than through the settings.
_TOKEN_SHAPE = re.compile(r"\d{6,12}:[A-Za-z0-9_-]{30,}")
# Authorization schemes: "Bearer abc…" is redacted whole and as "abc…", never as the word "Bearer".
_AUTH_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9_-]*)\s+(?P<credential>\S.*)$")


class SecretSet:
    """Secret values, and the forms they take in text (quoted in JSON, percent-encoded, a Basic credential
    decoded); thread-safe, since the model thread's text is redacted too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: tuple[str, ...] = ()
        self._pattern: re.Pattern[str] | None = None

    def add(self, secrets: Iterable[str | None]) -> None:
        """Redact `secrets` from now on (None, empty and short values are ignored)."""
        forms = {form for secret in secrets if secret for form in _forms(str(secret))}
        with self._lock:
            values = set(self._values) | {f for f in forms if len(f) >= MIN_SECRET_CHARS}
            if len(values) == len(self._values):
                return
            # Longest first, so a secret that contains another is replaced whole.
            self._values = tuple(sorted(values, key=lambda v: (-len(v), v)))
            self._pattern = re.compile("|".join(re.escape(v) for v in self._values))

    def add_url(self, url: str | None) -> None:
        """Redact the credentials a URL may carry: its user:password, its query values, a bot token in its path."""
        self.add(url_secrets(url or ""))

    def redact(self, text: str) -> str:
        """`text` with every known secret, and anything shaped like a bot token, replaced by [REDACTED]."""
        if not text:
            return text
        pattern = self._pattern
        if pattern is not None:
            text = pattern.sub(REDACTED, text)
        return _TOKEN_SHAPE.sub(REDACTED, text)

    def __contains__(self, value: object) -> bool:
        return value in self._values

    def __len__(self) -> int:
        return len(self._values)


def _forms(secret: str) -> set[str]:
    """The value, its credential after an auth scheme, and how each is written in JSON and in a URL."""
    values = {secret.strip()}
    if (match := _AUTH_SCHEME.match(secret.strip())) is not None:
        credential = match.group("credential").strip()
        values.add(credential)
        if match.group("scheme").lower() == "basic":
            values |= _basic_parts(credential)
    forms = set()
    for value in values:
        forms |= {value, json.dumps(value, ensure_ascii=False)[1:-1], quote(value, safe="")}
    return forms


def _basic_parts(credential: str) -> set[str]:
    """A Basic credential decoded: "user:password" and the password."""
    try:
        decoded = base64.b64decode(credential, validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return set()
    return {decoded, decoded.partition(":")[2]}


def url_secrets(url: str) -> list[str]:
    """What in a URL may be a credential: the user:password part, the password, each query value, and the path
    segment after `/bot` (the Bot API's token place)."""
    try:
        parts = urlsplit(url.strip())
        password = parts.password
    except ValueError:
        return []
    found = [value for _, value in parse_qsl(parts.query, keep_blank_values=False)]
    if password:
        found += [password, f"{parts.username}:{password}"]
    elif parts.username:
        found.append(parts.username)  # a token given as the user part alone (https://TOKEN@host)
    found += [segment[3:] for segment in parts.path.split("/") if segment.startswith("bot") and ":" in segment]
    return found


SECRETS = SecretSet()  # the process's one set


def remember_secrets(secrets: Iterable[str | None]) -> None:
    """Redact `secrets` everywhere from now on."""
    SECRETS.add(secrets)


def remember_url_secrets(url: str | None) -> None:
    """Redact the credentials in `url` everywhere from now on."""
    SECRETS.add_url(url)


def redact(text: str) -> str:
    """`text` with every secret the process knows replaced."""
    return SECRETS.redact(text)
