"""Entity linking before the first call: which known things a question names (a course from the database, matched
loosely), and the turn's tools held to them.

A question naming known entities must look them up before it is answered (the first-step policy, on by default:
REQUIRE_TOOL_CALL), and its search is bounded: one tool call per named entity, plus `extra` (a calculation, a
listing), after which the next step is the answer. The grammar (never the prompt, whose start stays the same for
every question so it stays cached) holds each linked tool's arguments to the named entities, so a small model cannot
look up another course. A question naming none (a greeting, arithmetic, a course the database does not have) is
left free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from tools.registry import Tool


@dataclass(frozen=True)
class Entities:
    """What a question names: per linking tool, its entities, and the tool held to them."""

    linked: dict[str, Tool] = field(default_factory=dict)  # tool name → the tool held to the named entities
    named: tuple[str, ...] = ()  # every entity named, once, in order

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The tools that know something the question names: one of them must be called first."""
        return tuple(self.linked)

    def held(self, tools: Sequence[Tool]) -> list[Tool]:
        """`tools` as the grammar holds them: each linked one replaced by its version held to the entities."""
        return [self.linked.get(tool.name, tool) for tool in tools]

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
