"""Reading one setting from the environment: the parsers, and the one-line refusals that name the variable.

Every message here starts with the variable's name (`MAX_STEPS must be …`) and quotes a bad value safely
(`shown`): never anything shaped like a bot token, never more than a line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from bot.program.ids import IdError, parse_chat_id, parse_user_id
from bot.program.logs import redact_token_shapes
from core.errors import BotError


class ConfigError(BotError, ValueError):
    """A setting has a value the bot cannot use; the message names the variable."""


def parse(name: str, type_name: str, raw: str) -> Any:
    """The value of field `name` (of type `type_name`, as its annotation is written) from the text `raw`."""
    if name in _ID_PARSERS:
        return _id_set(name, raw, _ID_PARSERS[name])
    parser = _PARSERS.get(type_name.replace(" ", ""))
    if parser is None:
        return raw
    try:
        return parser(raw)
    except ValueError:
        raise ConfigError(f"{name.upper()} must be {_DESCRIPTIONS[type_name.replace(' ', '')]}, "
                          f"got {shown(raw)}") from None


def _id_set(name: str, raw: str, parse_one: Callable[[str], int]) -> frozenset[int]:
    """Ids separated by commas (or semicolons), each read by the parser /allow uses (bot/program/ids.py)."""
    try:
        return frozenset(parse_one(part.strip()) for part in raw.replace(";", ",").split(",") if part.strip())
    except IdError as error:
        raise ConfigError(f"{name.upper()} must be a comma-separated list of numeric ids: "
                          f"{redact_token_shapes(str(error))}") from None


def _flag(raw: str) -> bool:
    folded = raw.lower()
    if folded not in _TRUE + _FALSE:
        raise ValueError(raw)
    return folded in _TRUE


_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")


def shown(value: str) -> str:
    """A bad value as an error message quotes it: never anything shaped like a bot token (a token pasted into
    the wrong variable is still a secret), and never more than a line's worth."""
    value = redact_token_shapes(value)
    return repr(value if len(value) <= SHOWN_CHARS else value[:SHOWN_CHARS] + "…")


SHOWN_CHARS = 60
_ID_PARSERS: dict[str, Callable[[str], int]] = {
    "admin_user_ids": parse_user_id,
    "allowed_user_ids": parse_user_id,
    "allowed_chat_ids": parse_chat_id,
}
_PARSERS: dict[str, Callable[[str], Any]] = {
    "bool": _flag,
    "int": int,
    "float": float,
    "Path": Path,
}
_DESCRIPTIONS = {
    "bool": "true or false (also on/off, yes/no, 1/0)",
    "int": "a whole number",
    "float": "a number",
    "Path": "a path",
}


def one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    """Refuse `value` of variable `name` unless it is one of `allowed`."""
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {shown(value)}")


def positive(group: object, names: Iterable[str]) -> None:
    """Refuse any of the fields `names` of `group` that is not greater than 0."""
    for name in names:
        value = getattr(group, name)
        if not value > 0:  # also refuses NaN, which compares false with everything
            raise ConfigError(f"{name.upper()} must be greater than 0, got {value}")


def not_negative(group: object, names: Iterable[str]) -> None:
    """Refuse any of the fields `names` of `group` that is below 0 (or NaN)."""
    for name in names:
        value = getattr(group, name)
        if not value >= 0:
            raise ConfigError(f"{name.upper()} must be 0 or more, got {value}")
