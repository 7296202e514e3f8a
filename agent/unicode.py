"""Text fit to leave the process: no lone surrogates.

A Python string can hold a lone UTF-16 surrogate (`"\\ud800"`): JSON's `\\ud800` escape decodes to one, and so do
undecodable bytes in a command line (`surrogateescape`). No UTF-8 encoder takes it: an HTTP request body, a Bot API
call and an SQLite row all fail on it. So text is cleaned where it comes in (an update, a model server's answer)
and again where it goes out (a model request, a Telegram message): each lone surrogate becomes U+FFFD, the
replacement character, and a proper pair written as two code points becomes the one character it stands for.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogates(text: str) -> bool:
    """Whether `text` holds any surrogate code point (lone, or half of a pair written out)."""
    return _SURROGATE.search(text) is not None


def clean_text(text: str) -> str:
    """`text` with lone surrogates replaced by U+FFFD and written-out pairs joined; unchanged when there is none."""
    if not has_surrogates(text):
        return text
    # UTF-16 with surrogatepass joins a high and a low surrogate into one character; a lone one cannot be
    # decoded and is replaced.
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def clean_json(value: Any) -> Any:
    """Every string of a JSON-shaped value (dict keys included) cleaned with `clean_text`."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_json(key): clean_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(item) for item in value]
    return value
