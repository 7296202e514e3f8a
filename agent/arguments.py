"""Reading tool arguments the way models actually write them.

Real Qwen outputs put JSON in code fences, use single quotes or trailing commas (Qwen's docs advise json5),
or give a plain string where an object was asked. Parsing never executes anything: json, then json5.
"""

from __future__ import annotations

import json
import re
from typing import Any

import json5

from tools.registry import Tool

MAX_INPUT_CHARS = 20_000
MAX_NESTING = 20
NOT_UNICODE = "the Action Input holds an escape that is no character (a lone UTF-16 surrogate such as \\ud800)"
_FENCE = re.compile(r"^```[a-zA-Z0-9_-]*\s*\n?(.*?)\n?```\s*$", re.DOTALL)


def strip_fence(text: str) -> str:
    """The content of a ``` code fence, or the text itself."""
    match = _FENCE.match(text.strip())
    return match.group(1).strip() if match else text.strip()


def first_json_object(text: str) -> str | None:
    """The first balanced {...} in `text` (a model sometimes adds words after the JSON)."""
    start = text.find("{")
    depth, quote, escaped = 0, "", False
    for index in range(start, len(text)) if start >= 0 else ():
        char = text[index]
        if quote:
            escaped, quote = (not escaped and char == "\\"), ("" if char == quote and not escaped else quote)
            continue
        if char in "\"'":
            quote = char
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return text[start:index + 1]
    return None


def loads_loosely(text: str) -> Any:
    """json, else json5 (single quotes, trailing commas, comments); raises ValueError if neither reads it."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return json5.loads(text)
    except Exception as error:  # json5 raises several types for bad input
        raise ValueError(str(error)) from None


def nesting_depth(value: Any, depth: int = 0) -> int:
    """How deeply lists and objects nest in `value` (stops counting past the limit)."""
    if depth > MAX_NESTING or not isinstance(value, (dict, list)):
        return depth
    children = value.values() if isinstance(value, dict) else value
    return max((nesting_depth(child, depth + 1) for child in children), default=depth + 1)


def read_arguments(raw: str, tool: Tool | None) -> tuple[Any, str | None]:
    """(arguments, None) when the input could be read, or (None, why not)."""
    if len(raw) > MAX_INPUT_CHARS:
        return None, f"the Action Input is longer than {MAX_INPUT_CHARS} characters"
    text = strip_fence(raw)
    if not text:
        takes_nothing = tool is not None and not tool.parameters.get("required")
        return ({}, None) if takes_nothing else (None, "the Action Input is empty")
    value, error = _parse(text)
    if isinstance(value, dict):
        if nesting_depth(value) > MAX_NESTING:
            return None, f"the arguments nest deeper than {MAX_NESTING} levels"
        return (value, None) if encodable(value) else (None, NOT_UNICODE)
    single = tool.single_parameter if tool else None
    if single and not text.lstrip().startswith(("{", "[")):
        # A plain string (or a quoted one) for a one-parameter tool: that is what the model meant.
        arguments = {single: value if isinstance(value, str) else text.strip().strip("'\"")}
        return (arguments, None) if encodable(arguments) else (None, NOT_UNICODE)
    return None, error or f"expected a JSON object, got {type(value).__name__}"


def encodable(value: Any) -> bool:
    """Whether every string in `value` is valid Unicode: JSON's "\\ud800" escape gives one that is not, and it would
    break every later step (token counting, the database, Telegram)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parse(text: str) -> tuple[Any, str | None]:
    for candidate in (text, first_json_object(text)):
        if candidate:
            try:
                return loads_loosely(candidate), None
            except (ValueError, RecursionError):
                continue
    return text, "the Action Input is not valid JSON"
