"""How a turn's steps read as text: in full for the terminal (`--trace`), compact for a chat (`/trace`)."""

from __future__ import annotations

from typing import Sequence

from agent.steps import TOOL_KINDS, Step, StepKind

OBSERVATION_CHARS = 300


def render_trace(steps: Sequence[Step], *, compact: bool = False, limit: int = OBSERVATION_CHARS) -> str:
    """The steps, long texts shortened to `limit`: one block per step, or (compact) a line or two per step."""
    if compact:
        return "\n".join(line for step in steps for line in _compact_lines(step, limit))
    if not steps:
        return "(no steps)"
    return "\n\n".join(_full_block(step, limit) for step in steps)


def shorten(value: str, limit: int = OBSERVATION_CHARS) -> str:
    """One line of at most `limit` characters."""
    flat = " ".join(value.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def _full_block(step: Step, limit: int) -> str:
    lines = [f"#{step.position} {step.kind}" + (f" ({step.duration_ms} ms)" if step.duration_ms else "")]
    if step.thought:
        lines.append(f"Thought: {step.thought}")
    if step.action:
        lines.append(f"Action: {step.action}")
        lines.append(f"Action Input: {step.action_input}")
    if step.observation:
        observation = step.observation if len(step.observation) <= limit else step.observation[:limit] + "…"
        label = "Answer" if step.kind in (StepKind.FINAL, StepKind.LIMIT) else "Observation"
        lines.append(f"{label}: {observation}")
    if step.error:
        lines.append(f"Error: {step.error}")
    return "\n".join(lines)


def _compact_lines(step: Step, limit: int) -> list[str]:
    if step.kind in TOOL_KINDS:
        return [f"{step.position}. 🔧 {step.action} {step.action_input.strip()} ({step.duration_ms} ms)",
                f"   → {shorten(step.observation, limit)}"]
    if step.kind != StepKind.FINAL:
        return [f"{step.position}. ⚠️ {step.kind}: {shorten(step.observation or step.error or '', limit)}"]
    return []
