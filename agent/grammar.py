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

Every answer text is capped (`answer_max_tokens`) and, for grounded answers, may write only the numbers the turn
has grounded (agent/grounding.py): `numbers` lists them as literals, and any other run of digits cannot be
generated. A small model then cannot write "20" when it observed 200, nor loop on "1.1.1.1…" unless 1 is grounded.
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
    answer_max_tokens: int = 256  # a final answer; a small model's loop ends here instead of at MAX_NEW_TOKENS

    def within(self, step_tokens: int) -> "GrammarLimits":
        """These limits for a step of at most `step_tokens` new tokens, so that a step always ends inside them.

        A step cut at the token limit cannot parse (cut in its Thought) or call its tool (cut in its JSON). The
        Thought gets a quarter of the budget at most; each free-text argument at most a third of what is left
        after ~32 tokens of `Action:`, tool name and JSON syntax (a character can take 3 tokens: CJK in a
        byte-level vocabulary). With MAX_NEW_TOKENS=128 and THOUGHT_MAX_TOKENS=128, a tiny model rambled in its
        Thought to the cut on a third of its steps.
        """
        thought = max(1, min(self.thought_max_tokens, step_tokens // 4))
        strings = max(8, min(self.string_max_chars, (step_tokens - thought - _ACTION_TOKENS) // 3))
        answer = max(1, min(self.answer_max_tokens, step_tokens - thought - _FINAL_TOKENS))
        return replace(self, thought_max_tokens=thought, string_max_chars=strings, answer_max_tokens=answer)


@dataclass(frozen=True)
class Grammar:
    """A constraint on one model call: `lark` in llguidance's dialect; `kind` says which shape it describes."""

    kind: str  # react_step, react_final, native
    lark: str

    def for_llguidance_servers(self) -> str:
        """The grammar marked as llguidance's, as SGLang and llama.cpp want it to tell it from GBNF."""
        return "%llguidance {}\n" + self.lark


def react_step_grammar(tools: Sequence["Tool"], *, continuing: bool, tool_required: bool = False,
                       limits: GrammarLimits = GrammarLimits(), numbers: Sequence[str] | None = None) -> Grammar:
    """One ReAct step with `tools`; `continuing` when the trace already ends in `Thought:`.

    `tool_required` leaves out the Final Answer branch: the step must call a tool (the first-step policy).
    `numbers`, when given, are the only numbers the answer may write (none at all when empty).
    """
    if not tools:
        raise ValueError("a ReAct step grammar needs at least one tool")
    opening = '" "' if continuing else '"Thought: "'
    branches = "action" if tool_required else "action | final"
    lines = [
        f"start: {opening} thought \"\\n\" ({branches})",
        f"thought[max_tokens={limits.thought_max_tokens}]: {_THOUGHT}",
        "action: " + " | ".join(f"call_{index}" for index in range(len(tools))),
        *(_react_call(index, tool, limits) for index, tool in enumerate(tools)),
        *([] if tool_required else ['final: "Final Answer: " answer', _answer_rule(_ANSWER, limits, numbers)]),
    ]
    return Grammar("react_step", "\n".join(lines) + "\n")


def react_final_grammar(limits: GrammarLimits = GrammarLimits(), numbers: Sequence[str] | None = None) -> Grammar:
    """The answer after a trace that ends in `Final Answer:` (the search ended, or the step limit was reached)."""
    return Grammar("react_final", 'start: " " answer\n' + _answer_rule(_ANSWER, limits, numbers) + "\n")


def native_grammar(tools: Sequence["Tool"], *, tool_required: bool = False,
                   limits: GrammarLimits = GrammarLimits(), numbers: Sequence[str] | None = None) -> Grammar:
    """A native reply: an answer in free text, or one or more `<tool_call>` blocks of Qwen2.5/Qwen3 templates.

    An answer may not start with `<`, so a tool call cannot be half-written as text; a Qwen3 `<think>` block may
    come first. `tool_required` leaves out the free-text answer; `numbers` as in `react_step_grammar`.
    """
    if not tools:
        raise ValueError("a native tool-call grammar needs at least one tool")
    calls = _COMPACT_JSON | {"anyOf": [_native_call_schema(tool, limits) for tool in tools]}
    lines = [
        "start: think? calls" if tool_required else "start: think? (text | calls)",
        _THINK,
        *([] if tool_required else [_answer_rule(_NATIVE_TEXT, limits, numbers, name="text")]),
        'calls: call ("\\n" call)*',
        'call: "<tool_call>\\n" call_body "\\n</tool_call>"',
        "call_body: %json " + _json(calls),
    ]
    return Grammar("native", "\n".join(lines) + "\n")


def native_answer_grammar(limits: GrammarLimits = GrammarLimits(), numbers: Sequence[str] | None = None) -> Grammar:
    """A native reply that must be the answer (tools are no longer offered: the search ended)."""
    lines = ["start: think? text", _THINK, _answer_rule(_NATIVE_TEXT, limits, numbers, name="text")]
    return Grammar("native_answer", "\n".join(lines) + "\n")


def numbers_pattern(numbers: Sequence[str]) -> str:
    """A regular expression for text whose every run of digits is one of `numbers` ("200", "1.5"): a number is
    followed by a non-digit, so "20" cannot grow into "200" unless 200 is listed, nor "2" into "2022"."""
    other = "[^0-9\uff10-\uff19]"  # full-width digits too: they read as digits (agent/numbers.py)
    if not numbers:
        return f"{other}*"
    literal = "(?:" + "|".join(number.replace(".", "\\.") for number in numbers) + ")"
    return f"{other}*(?:{literal}{other}+)*{literal}?"


def capped_schema(schema: dict[str, Any], max_chars: int) -> dict[str, Any]:
    """A copy of `schema` in which every free-text string (no enum, const, pattern or format) is at most
    `max_chars` long (a shorter `maxLength` of its own stays), so a rambling model cannot fill the whole token
    budget with one argument."""
    capped = copy.deepcopy(schema)
    _cap_strings(capped, max_chars)
    return capped


# ── helpers ──────────────────────────────────────────────────────────────────────────────────────────────────────

# Room for `\nAction: <tool>\nAction Input: ` and the JSON's own syntax, in tokens (GrammarLimits.within).
_ACTION_TOKENS = 32
# Room for `\nFinal Answer: `, in tokens (GrammarLimits.within).
_FINAL_TOKENS = 8
# A Thought is one line, and never holds "Observation:": the reply's stop string would cut the step there.
_THOUGHT = "/[^\\n]+/ & ~/(?s:.*)Observation:(?s:.*)/"
# The answer is free text to the end of the reply (EOS); answer_max_tokens bounds it. It starts with a visible
# character (a blank answer is no answer) and not with a stop string (that would leave it empty).
_ANSWER = "/[^ \\t\\r\\n](.|\\n)*/ & ~/(Observation:|Question:)(?s:.*)/"
# A native answer: free text that does not start with `<` (a tool call cannot be half-written as text).
_NATIVE_TEXT = "/[^<](.|\\n)*/"
_THINK = 'think[lazy]: "<think>" /(.|\\n)*<\\/think>\\n*/'
# Tool arguments as compact one-line JSON, `{"key": "value", "n": 1}` as in Qwen's examples: JSON's free
# whitespace let a tiny model fill its whole step with newlines inside `{}`.
_COMPACT_JSON = {"x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}
_FIXED_TEXT = ("enum", "const", "pattern", "format")


def _answer_rule(text: str, limits: GrammarLimits, numbers: Sequence[str] | None, name: str = "answer") -> str:
    """The rule of an answer's text: capped at `answer_max_tokens`, its numbers limited to `numbers` if given."""
    grounded = "" if numbers is None else f" & /{numbers_pattern(numbers)}/"
    return f"{name}[max_tokens={limits.answer_max_tokens}]: {text}{grounded}"


def _react_call(index: int, tool: "Tool", limits: GrammarLimits) -> str:
    head = json.dumps(f"{tool.name}\nAction Input: ", ensure_ascii=False)
    return (f'call_{index}: "Action: " {head} args_{index} "\\n"\n'
            f"args_{index}: %json {_json(_COMPACT_JSON | capped_schema(tool.parameters, limits.string_max_chars))}")


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
    if is_string and not any(key in node for key in _FIXED_TEXT):
        node["maxLength"] = min(node.get("maxLength", max_chars), max_chars)
    for value in node.values():
        _cap_strings(value, max_chars)
