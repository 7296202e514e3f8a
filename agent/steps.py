"""What the model's reply means (a decision), and what a turn records (its steps)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union


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
    kind: str  # tool, repeated, final, format_error, limit
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
    status: str  # answered, step_limit, gave_up
    turn_id: int | None = None
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    duration_ms: int = 0

    @property
    def tool_steps(self) -> list[Step]:
        """The steps that ran (or tried to run) a tool."""
        return [step for step in self.steps if step.kind in ("tool", "repeated")]


def format_trace(steps: list[Step], observation_chars: int = 300) -> str:
    """The steps of a turn as plain text, one block per step (for `--trace`, `/trace`)."""
    if not steps:
        return "(no steps)"
    return "\n\n".join(_format_step(step, observation_chars) for step in steps)


def _format_step(step: Step, observation_chars: int) -> str:
    lines = [f"#{step.position} {step.kind}" + (f" ({step.duration_ms} ms)" if step.duration_ms else "")]
    if step.thought:
        lines.append(f"Thought: {step.thought}")
    if step.action:
        lines.append(f"Action: {step.action}")
        lines.append(f"Action Input: {step.action_input}")
    if step.observation:
        observation = step.observation
        if len(observation) > observation_chars:
            observation = observation[:observation_chars] + "…"
        label = "Answer" if step.kind in ("final", "limit") else "Observation"
        lines.append(f"{label}: {observation}")
    if step.error:
        lines.append(f"Error: {step.error}")
    return "\n".join(lines)
