"""The grammar of one model call, built from the tools enabled for the chat: what a reply may look like at all.

A ReAct step is `Thought: <one line>` then either `Action: <an enabled tool>` + `Action Input: <JSON valid
against that tool's parameter schema>` (and the reply ends there, as at `Observation:`), or `Final Answer: <text>`.
Decoding under this grammar makes a reply that breaks the format impossible, on any model, however small.

The grammar is plain text in the Lark dialect of llguidance (`%json {...}` embeds a JSON schema; `name[max_tokens=N]`
bounds a free-text part), so it is backend-neutral: the local backend compiles it with llguidance, and the openai
backend can send it to servers that accept one (vLLM's and SGLang's structured outputs, llama.cpp built with
llguidance). Nothing here imports a grammar engine.

    fresh step           Thought: <line>\\n (Action: <tool>\\nAction Input: <json>\\n | Final Answer: <text>)
    continued step       the same after a trace that already ends in `Thought:` (it starts with the line)
    final answer         after a trace that ends in `Final Answer:`: the answer text only
    native tool call     free text, or <tool_call>\\n{"name": <tool>, "arguments": <json>}\\n</tool_call> (repeatable)
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from tools.registry import Tool


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on the free-text parts of a reply (from Settings)."""

    thought_max_tokens: int = 128  # one Thought line; then the model must act or answer
    string_max_chars: int = 200  # a cap on tool-argument strings whose schema sets none

    def within(self, step_tokens: int) -> "GrammarLimits":
        """These limits for a step of at most `step_tokens` new tokens: the Thought gets half of them at most.

        A step cut at the token limit before its Action Input closes cannot parse; with a Thought as long as the
        whole budget (THOUGHT_MAX_TOKENS = MAX_NEW_TOKENS) a tiny model rambled to the cut on every step.
        """
        return replace(self, thought_max_tokens=max(1, min(self.thought_max_tokens, step_tokens // 2)))


@dataclass(frozen=True)
class Grammar:
    """A constraint on one model call: `lark` in llguidance's dialect; `kind` says which shape it describes."""

    kind: str  # react_step, react_final, native
    lark: str

    def for_llguidance_servers(self) -> str:
        """The grammar marked as llguidance's, as SGLang and llama.cpp want it to tell it from GBNF."""
        return "%llguidance {}\n" + self.lark


def react_step_grammar(tools: Sequence["Tool"], *, continuing: bool, tool_required: bool = False,
                       limits: GrammarLimits = GrammarLimits()) -> Grammar:
    """One ReAct step with `tools`; `continuing` when the trace already ends in `Thought:`.

    `tool_required` leaves out the Final Answer branch: the step must call a tool (the first-step policy).
    """
    if not tools:
        raise ValueError("a ReAct step grammar needs at least one tool")
    opening = '" "' if continuing else '"Thought: "'
    branches = "action" if tool_required else "action | final"
    lines = [
        f"start: {opening} thought \"\\n\" ({branches})",
        f"thought[max_tokens={limits.thought_max_tokens}]: /[^\\n]+/",
        "action: " + " | ".join(f"call_{index}" for index in range(len(tools))),
        *(_react_call(index, tool, limits) for index, tool in enumerate(tools)),
        *([] if tool_required else ['final: "Final Answer: " ANSWER', _ANSWER]),
    ]
    return Grammar("react_step", "\n".join(lines) + "\n")


def react_final_grammar() -> Grammar:
    """The answer after a trace that ends in `Final Answer:` (the step limit was reached)."""
    return Grammar("react_final", 'start: " " ANSWER\n' + _ANSWER + "\n")


def native_grammar(tools: Sequence["Tool"], *, tool_required: bool = False,
                   limits: GrammarLimits = GrammarLimits()) -> Grammar:
    """A native reply: an answer in free text, or one or more `<tool_call>` blocks of Qwen2.5/Qwen3 templates.

    An answer may not start with `<`, so a tool call cannot be half-written as text; a Qwen3 `<think>` block may
    come first. `tool_required` leaves out the free-text answer.
    """
    if not tools:
        raise ValueError("a native tool-call grammar needs at least one tool")
    calls = {"anyOf": [_native_call_schema(tool, limits) for tool in tools]}
    lines = [
        "start: think? calls" if tool_required else "start: think? (TEXT | calls)",
        'think[lazy]: "<think>" /(.|\\n)*<\\/think>\\n*/',
        *([] if tool_required else ["TEXT: /[^<](.|\\n)*/"]),
        'calls: call ("\\n" call)*',
        'call: "<tool_call>\\n" call_body "\\n</tool_call>"',
        "call_body: %json " + _json(calls),
    ]
    return Grammar("native", "\n".join(lines) + "\n")


def capped_schema(schema: dict[str, Any], max_chars: int) -> dict[str, Any]:
    """A copy of `schema` in which every free-text string (no length, enum, const or pattern of its own) gets
    `maxLength: max_chars`, so a rambling model cannot fill the whole token budget with one argument."""
    capped = copy.deepcopy(schema)
    _cap_strings(capped, max_chars)
    return capped


# ── helpers ──────────────────────────────────────────────────────────────────────────────────────────────────────

# The answer is free text to the end of the reply (EOS); MAX_NEW_TOKENS bounds it.
_ANSWER = "ANSWER: /(.|\\n)+/"
_FREE_TEXT_BOUNDS = ("maxLength", "enum", "const", "pattern", "format")


def _react_call(index: int, tool: "Tool", limits: GrammarLimits) -> str:
    head = json.dumps(f"{tool.name}\nAction Input: ", ensure_ascii=False)
    return (f'call_{index}: "Action: " {head} args_{index} "\\n"\n'
            f"args_{index}: %json {_json(capped_schema(tool.parameters, limits.string_max_chars))}")


def _native_call_schema(tool: "Tool", limits: GrammarLimits) -> dict[str, Any]:
    return {"type": "object",
            "properties": {"name": {"const": tool.name},
                           "arguments": capped_schema(tool.parameters, limits.string_max_chars)},
            "required": ["name", "arguments"], "additionalProperties": False}


def _json(schema: dict[str, Any]) -> str:
    """A schema as one line of JSON (Lark's `%json` takes it inline; a newline inside would end the rule)."""
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def _cap_strings(node: Any, max_chars: int) -> None:
    if isinstance(node, list):
        for item in node:
            _cap_strings(item, max_chars)
        return
    if not isinstance(node, dict):
        return
    kinds = node.get("type")
    is_string = kinds == "string" or (isinstance(kinds, list) and "string" in kinds)
    if is_string and not any(key in node for key in _FREE_TEXT_BOUNDS):
        node["maxLength"] = max_chars
    for value in node.values():
        _cap_strings(value, max_chars)
