"""What a running turn tells its caller as it goes: the events of `Agent.run(..., on_event=...)`.

    ModelCall       a model call starts (the model is thinking: a spinner, "typing…")
    ToolStarted     a tool runs now, with this input
    ToolFinished    its observation (or error)
    AnswerText      the final answer as far as it is generated, whole each time; '' takes back what was shown

Only the final answer streams, never Thought or Action text. The sink is called on the event loop and must return
quickly: a caller that talks to the network (Telegram) keeps the latest state and sends it from its own task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Union


@dataclass(frozen=True)
class ModelCall:
    """The model is asked for step `step` (1 for the first call of the turn)."""

    step: int


@dataclass(frozen=True)
class ToolStarted:
    """A tool is asked for: its name, its progress label for people (`🔎 查询课程数据库`), and its input as the
    model wrote it and as read (None when it could not be read)."""

    tool: str
    label: str
    raw_input: str
    arguments: Any = None

    @property
    def shown_input(self) -> str:
        """The input for people: the argument values, without JSON punctuation."""
        if isinstance(self.arguments, dict):
            return ", ".join(str(value) for value in self.arguments.values())
        return str(self.arguments) if self.arguments is not None else self.raw_input


@dataclass(frozen=True)
class ToolFinished:
    """A tool's observation (what the model will read), and its error kind if it failed."""

    tool: str
    observation: str
    error: str | None = None


@dataclass(frozen=True)
class AnswerText:
    """The final answer so far. It grows as the model writes; '' means the text shown was not the answer after all
    (the model went on to call a tool), and whatever showed it should take it back."""

    text: str


TurnEvent = Union[ModelCall, ToolStarted, ToolFinished, AnswerText]
EventSink = Callable[[TurnEvent], None]
