"""Telegram ids as people write them: one parser for the settings (ADMIN_USER_IDS, ALLOWED_USER_IDS,
ALLOWED_CHAT_IDS) and for the admin commands (/allow, /deny), so both accept exactly the same words.

An id is ASCII digits with an optional leading minus: no `1_001` (Python's `int` takes it), no fullwidth `１２３` or
Arabic-Indic `١٢٣` digits (`int` takes those too), no `+`, no spaces inside. Users are positive, groups negative.
Telegram's service accounts are refused as users to give access to: messages from anonymous group admins, from
channels and from Telegram itself carry them as their sender, so allowing one would let all of those in.
"""

from __future__ import annotations

from bot.program.logs import redact_token_shapes

# Telegram ids have at most 52 significant bits; a larger number is no id (and would not fit SQLite's INTEGER).
MAX_ID = 2 ** 53

SERVICE_ACCOUNTS = {
    777000: "Telegram's service account, the sender of posts forwarded from a linked channel",
    1087968824: "GroupAnonymousBot, the sender of every anonymous group admin's message",
    136817688: "Channel_Bot, the sender of every message written on behalf of a channel",
}


class IdError(ValueError):
    """A word that is not an id of the kind wanted; the message says why, in words for the admin."""


def parse_id(word: str) -> int:
    """A user id (positive) or a group id (negative), written in ASCII digits."""
    digits = word[1:] if word.startswith("-") else word
    if not (digits.isascii() and digits.isdigit()):
        raise IdError(f"{_quoted(word)} is not an id: write it in digits 0-9 only, with a leading - for a group")
    value = int(word)
    if not 0 < abs(value) < MAX_ID:
        raise IdError(f"{_quoted(word)} is not an id: Telegram ids are non-zero and below 2^53")
    return value


def parse_user_id(word: str) -> int:
    """A user id that may be given access or admin rights: positive, and no service account."""
    value = parse_id(word)
    if value < 0:
        raise IdError(f"{value} is a group id; a user id is positive")
    refuse_service_account(value)
    return value


def parse_chat_id(word: str) -> int:
    """A group id: negative."""
    value = parse_id(word)
    if value > 0:
        raise IdError(f"{value} is a user id; a group id is negative (e.g. -1001234567890)")
    return value


def refuse_service_account(user_id: int) -> None:
    """Raise IdError for Telegram's service accounts, which stand for many senders at once."""
    if user_id in SERVICE_ACCOUNTS:
        raise IdError(f"{user_id} is {SERVICE_ACCOUNTS[user_id]}; giving it access would let all of them in")


def _quoted(word: str) -> str:
    """The word as a message quotes it: cut short, and never a bot token (one pasted by mistake is a secret)."""
    word = redact_token_shapes(word)
    return repr(word if len(word) <= 40 else word[:40] + "…")


def is_service_account(user_id: int | None) -> bool:
    """Whether `user_id` is one of Telegram's service accounts."""
    return user_id in SERVICE_ACCOUNTS
