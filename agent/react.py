"""Reading a ReAct reply: pure functions from model text to a decision.

Tolerates the failure shapes real models produce: the stop word half-emitted (`Observ`), `Action Input` missing,
an action and a final answer in one reply, fenced or json5-style JSON, a plain string for a one-parameter tool, a
tool name with spaces or odd case, several actions at once (the first is taken), and no `Final Answer:` at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from agent.arguments import read_arguments
from agent.prompts import REACT_STOP
from agent.steps import Decision, FinalAnswer, FormatProblem, ToolRequest
from tools.registry import Tool

# A marker starts a line; models sometimes bold it (`**Final Answer:**`, `**Final Answer**:`) or use a full-width
# colon. Asterisks after the colon close a bold marker only: in `Final Answer: **200**` they are the answer's own.
_MARKER = re.compile(
    r"^[ \t]*(?P<bold>\*+)?[ \t]*(?P<marker>Thought|Action Input|Action|Observation|Final Answer)[ \t]*"
    r"(?P<closed>\*+)?[ \t]*[:：][ \t]*(?(bold)(?(closed)|\**))[ \t]*",
    re.IGNORECASE | re.MULTILINE,
)
# "\nObserv" at the very end: the stop word cut off by the token limit or a server's stop handling.
_HALF_STOP = re.compile(r"\n[ \t]*O(?:b(?:s(?:e(?:r(?:v(?:a(?:t(?:i(?:o(?:n(?::)?)?)?)?)?)?)?)?)?)?)?[ \t]*$")


@dataclass(frozen=True)
class Segment:
    """A marker and the text after it, up to the next marker; `end` is where that text ends in the reply."""

    marker: str
    text: str
    end: int


def strip_half_stop(text: str) -> str:
    """Drop a partly emitted `Observation:` from the end of a reply."""
    return _HALF_STOP.sub("", text.rstrip())


def segments(text: str) -> tuple[str, list[Segment]]:
    """(text before the first marker, the marked segments in order)."""
    matches = list(_MARKER.finditer(text))
    lead = text[: matches[0].start()] if matches else text
    found = []
    for match, following in zip(matches, matches[1:] + [None]):
        end = following.start() if following else len(text)
        found.append(Segment(match.group("marker").lower(), text[match.end():end].strip(), end))
    return lead.strip(), found


def parse_react(reply: str, tools: Sequence[Tool]) -> Decision:
    """What a ReAct reply asks for: a tool call, a final answer, or a format problem."""
    text = strip_half_stop(reply.split(f"\n{REACT_STOP}")[0])
    lead, parts = segments(text)
    thought = next((p.text for p in parts if p.marker == "thought"), lead)
    decisive = next((i for i, p in enumerate(parts) if p.marker in ("action", "final answer")), None)
    if decisive is None:
        usable = _without_markers(text)
        return FormatProblem("the reply has no Action and no Final Answer" if usable else "the reply is empty", usable)
    part = parts[decisive]
    if part.marker == "final answer":
        return _final(thought, part)
    return _tool_request(thought, parts, decisive, text, tools)


def _final(thought: str, part: Segment) -> Decision:
    if not part.text:
        return FormatProblem("the Final Answer is empty", thought)
    return FinalAnswer(thought, part.text)


def _tool_request(thought: str, parts: list[Segment], index: int, text: str, tools: Sequence[Tool]) -> ToolRequest:
    action = parts[index]
    name, inline_input = split_action(action.text, tools)
    tool = find_tool(name, tools)
    following = parts[index + 1] if index + 1 < len(parts) else None
    if following is not None and following.marker == "action input":
        raw, end = following.text, following.end
    else:
        raw, end = inline_input, action.end
    arguments, error = read_arguments(raw, tool)
    if not raw and error:
        error = "Action Input is missing: write it on its own line after the Action, as a JSON object"
    return ToolRequest(thought, tool.name if tool else name, raw, arguments, error, text[:end].rstrip())


def split_action(action_text: str, tools: Sequence[Tool]) -> tuple[str, str]:
    """Split `course_query({"course_name": ...})` or `course_query: 大模型` into (name, inline input)."""
    first_line = action_text.split("\n", 1)[0].strip()
    call = re.match(r"^([\w .\-`\[\]]+?)\s*\((.*)\)\s*$", first_line, re.DOTALL)
    if call and find_tool(call.group(1), tools):
        return call.group(1), call.group(2)
    for tool in tools:
        if normalize_tool_name(first_line).startswith(tool.name.lower() + "_") or first_line.startswith(tool.name + ":"):
            return tool.name, first_line[len(tool.name):].lstrip(" :_")
    return first_line, ""


def normalize_tool_name(name: str) -> str:
    """`Course Query`, "`course_query`", "[course_query]" all become `course_query`."""
    cleaned = name.strip().strip("`'\"[]()<>*. ").lower()
    return re.sub(r"[\s\-]+", "_", cleaned)


def find_tool(name: str, tools: Sequence[Tool]) -> Tool | None:
    """The tool a (possibly sloppy) name refers to, or None."""
    wanted = normalize_tool_name(name)
    return next((tool for tool in tools if tool.name.lower() == wanted), None)


# --- a reply still being generated (streaming) ---------------------------------------------------------------

_MARKER_WORDS = ("thought", "action input", "action", "observation", "final answer")


def complete_lines(text: str) -> str:
    """`text` without a last line that may still grow into a marker (`Obs`, `Final Ans`, `**`): not to show yet."""
    head, _, last = text.rpartition("\n")
    start = last.lstrip(" \t*").lower().rstrip(" \t*")
    if last.strip() and any(word.startswith(start) for word in _MARKER_WORDS):
        return head
    return text


def final_answer_so_far(text: str) -> str | None:
    """The Final Answer of a ReAct reply still being generated, as far as it is sure; None while the reply is not
    (or not yet) a final answer. Reads the reply as `parse_react` does, so the whole reply gives its answer."""
    _, parts = segments(complete_lines(text.split(f"\n{REACT_STOP}")[0]))
    decisive = next((p for p in parts if p.marker in ("action", "final answer")), None)
    if decisive is None or decisive.marker != "final answer":
        return None
    return decisive.text or None


def plain_answer_so_far(text: str, *, lead_first: bool = False) -> str | None:
    """The answer of a reply that is all answer (no tools; or the answer asked for at the step limit, where the
    text before any marker counts first), as far as it is sure; None while there is none to show."""
    lead, parts = segments(complete_lines(text))
    final = next((p.text for p in parts if p.marker == "final answer"), "")
    return ((lead or final) if lead_first else (final or lead)) or None


def _without_markers(text: str) -> str:
    """A reply's prose with ReAct markers removed: what could stand as an answer."""
    return _MARKER.sub("", text).strip()
