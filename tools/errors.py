"""Errors tools raise on purpose (the whole tree, with its root, is drawn in db/errors.py).

    ToolError               a tool refuses its input; the message is written for whoever gave it
    ├── UnknownTool         no registered tool has that name (also a KeyError, for lookups)
    ├── CalculationError    not plain arithmetic, or too big to compute
    └── CourseError         an invalid course change (empty name, negative lessons, unknown course)

The registry turns a `ToolError` into an observation the model can act on (error kind `tool_error`);
any other exception from a tool is logged as a bug and reported to the model as `exception`.
"""

from db.errors import BotError


class ToolError(BotError, ValueError):
    """A tool refuses its input."""


class UnknownTool(ToolError, KeyError):
    """No registered tool has this name."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else ""


class CalculationError(ToolError):
    """The expression is not plain arithmetic, or is too big to compute."""


class CourseError(ToolError):
    """A course change the database refuses."""
