"""Reading native tool calls: the `<tool_call>` JSON of Qwen2.5 / Qwen3 chat templates, or a server's parsed calls.

Qwen3 may think first (`<think>…</think>`); a tool call written while thinking is not a call.
"""

from __future__ import annotations

import re
from typing import Sequence

from agent.arguments import NOT_UNICODE, encodable, loads_loosely, read_arguments
from agent.llm.base import Completion, ToolCall
from agent.steps import Decision, FinalAnswer, FormatProblem, ToolRequest
from tools.registry import Tool

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def strip_thinking(text: str) -> tuple[str, str]:
    """(text without thinking, the thinking)."""
    thinking = " ".join(m.group(0)[len("<think>"):].replace("</think>", "").strip() for m in _THINK.finditer(text))
    return _THINK.sub("", text).strip(), thinking


def native_answer_so_far(text: str) -> str | None:
    """The answer of a native reply still being generated, thinking left out; None once it turns out to be a tool
    call, or while nothing is sure yet (a trailing `<to` may grow into `<tool_call>`)."""
    visible, _ = strip_thinking(text)
    visible = _without_partial_tag(visible)
    if "<tool_call>" in visible:
        return None
    return visible.strip() or None


def _without_partial_tag(text: str) -> str:
    opening = text.rfind("<")
    if opening >= 0 and any(tag.startswith(text[opening:]) for tag in ("<tool_call>", "<think>")):
        return text[:opening]
    return text


def parse_native(completion: Completion, tools: Sequence[Tool]) -> list[ToolRequest] | Decision:
    """The tool calls a native reply asks for, or its final answer, or a format problem."""
    text, thinking = strip_thinking(completion.text)
    if completion.tool_calls:
        return [_request(call, tools, thinking) for call in completion.tool_calls]
    blocks = [block.strip() for block in _TOOL_CALL.findall(text)]
    if blocks:
        return [_request_from_block(block, tools, thinking, i) for i, block in enumerate(blocks)]
    if not text:
        return FormatProblem("the reply is empty")
    return FinalAnswer(thinking, text)


def _request(call: ToolCall, tools: Sequence[Tool], thinking: str) -> ToolRequest:
    tool = next((t for t in tools if t.name == call.name), None)
    arguments, error = read_arguments(call.arguments or "{}", tool)
    return ToolRequest(thinking, call.name, call.arguments, arguments, error, call_id=call.id)


def _request_from_block(block: str, tools: Sequence[Tool], thinking: str, index: int) -> ToolRequest:
    call_id = f"call_{index}"
    try:
        payload = loads_loosely(block)
    except ValueError as error:
        return ToolRequest(thinking, "", block, None, f"the tool call is not valid JSON: {error}", call_id=call_id)
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ToolRequest(thinking, "", block, None, 'a tool call must be {"name": ..., "arguments": {...}}',
                           call_id=call_id)
    raw = payload.get("arguments", {})
    arguments = raw if isinstance(raw, dict) else None
    if isinstance(raw, str):
        tool = next((t for t in tools if t.name == payload["name"]), None)
        arguments, error = read_arguments(raw, tool)
        return ToolRequest(thinking, payload["name"], raw, arguments, error, call_id=call_id)
    if arguments is not None and not encodable(arguments):
        return ToolRequest(thinking, payload["name"], block, None, NOT_UNICODE, call_id=call_id)
    error = None if arguments is not None else "arguments must be a JSON object"
    return ToolRequest(thinking, payload["name"], block, arguments, error, call_id=call_id)
