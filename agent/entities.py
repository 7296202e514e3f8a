"""Entity linking before the first call: which known things a question names (a course from the database, matched
loosely), and the turn's tools held to them.

A question naming known entities must look them up before it is answered (the first-step policy, on by default:
REQUIRE_TOOL_CALL), and its search is bounded: one tool call per named entity, plus `extra` (a calculation), after
which the next step is the answer. The grammar (never the prompt, whose start stays the same for every question so
it stays cached) holds each linked tool's arguments to the named entities, so a small model cannot look up another
course, and leaves out the tools a link says add nothing (the course list, once the courses are named). A question
naming none (a greeting, arithmetic, a course the database does not have) is left free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from tools.registry import Tool


@dataclass(frozen=True)
class Entities:
    """What a question names: per linking tool, its entities, and the tool held to them."""

    linked: dict[str, Tool | None] = field(default_factory=dict)  # tool name → held to the entities (None: left out)
    named: tuple[str, ...] = ()  # every entity named, once, in order

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The tools that know something the question names: one of them must be called first."""
        return tuple(name for name, tool in self.linked.items() if tool is not None)

    @property
    def left_out(self) -> tuple[str, ...]:
        """The tools the grammar leaves out for this question."""
        return tuple(name for name, tool in self.linked.items() if tool is None)

    @property
    def held_tools(self) -> tuple[Tool, ...]:
        """The tools held to the named entities."""
        return tuple(tool for tool in self.linked.values() if tool is not None)

    def tool_budget(self, extra: int) -> int | None:
        """The tool calls the question's search may make before it must be answered; None when it names nothing
        (then only the step limit bounds it)."""
        return len(self.named) + extra if self.named else None


async def link_entities(tools: Sequence[Tool], question: str) -> Entities:
    """The entities `question` names among those `tools` know."""
    linked: dict[str, Tool] = {}
    named: dict[str, None] = {}
    for tool in tools:
        if tool.link is None:
            continue
        found = await tool.link(tool, question)
        if found is not None:
            linked[tool.name] = found.tool
            named.update(dict.fromkeys(found.entities))
    return Entities(linked, tuple(named))
