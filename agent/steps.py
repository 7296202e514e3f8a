"""What the model's reply means (a decision), and what a turn records (its steps)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Union


class StepKind(StrEnum):
    """What one iteration of the loop did (the `steps.kind` column)."""

    TOOL = "tool"  # ran (or tried to run) a tool
    REPEATED = "repeated"  # asked for a call it had made already: the earlier observation was replayed
    FINAL = "final"  # gave the final answer
    FORMAT_ERROR = "format_error"  # a reply that was neither an action nor a final answer
    LIMIT = "limit"  # the answer asked for once the step limit was reached


class TurnStatus(StrEnum):
    """How a turn ended (the `turns.status` column)."""

    ANSWERED = "answered"  # a final answer
    STEP_LIMIT = "step_limit"  # the step limit, then the answer asked for (or an apology)
    GAVE_UP = "gave_up"  # the format reminder did not help: the model's usable text, or an apology
    CANCELLED = "cancelled"  # /cancel or shutdown: kept for /stats, never in the history
    ERROR = "error"  # the backend failed or timed out: kept for /stats, never in the history


TOOL_KINDS = (StepKind.TOOL, StepKind.REPEATED)


@dataclass(frozen=True)
class ToolRequest:
    """The model asks for a tool. `arguments` is None when its input could not be read (`input_error` says why)."""

    thought: str
    tool: str
    raw_input: str
    arguments: Any
    input_error: str | None = None
    trace_text: str = ""  # the reply as kept in the trace: cut after the action, half stop words removed
    call_id: str = ""


@dataclass(frozen=True)
class FinalAnswer:
    """The model answers."""

    thought: str
    answer: str


@dataclass(frozen=True)
class FormatProblem:
    """The reply is neither a usable action nor a final answer. `usable_text` is what could stand as an answer."""

    reason: str
    usable_text: str = ""


Decision = Union[ToolRequest, FinalAnswer, FormatProblem]


@dataclass(frozen=True)
class Step:
    """One iteration of the loop, as stored in the `steps` table and shown by /trace."""

    position: int
    kind: StepKind
    thought: str = ""
    action: str = ""
    action_input: str = ""
    observation: str = ""
    error: str | None = None
    duration_ms: int = 0


@dataclass(frozen=True)
class TurnResult:
    """The outcome of `Agent.run`: the answer for the user and the steps that led to it."""

    answer: str
    steps: list[Step]
    status: TurnStatus
    turn_id: int | None = None
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration_ms: int = 0

    @property
    def tool_steps(self) -> list[Step]:
        """The steps that ran (or tried to run) a tool."""
        return [step for step in self.steps if step.kind in TOOL_KINDS]
