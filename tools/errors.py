"""Errors tools raise on purpose.

    ToolError               a tool refuses its input; the message is written for whoever gave it
    ├── CalculationError    not plain arithmetic, or too big to compute
    └── CourseError         an invalid course change (empty name, negative lessons, unknown course)

The registry turns a `ToolError` into an observation the model can act on (error kind `tool_error`);
any other exception from a tool is logged as a bug and reported to the model as `exception`.
"""


class ToolError(ValueError):
    """A tool refuses its input."""


class CalculationError(ToolError):
    """The expression is not plain arithmetic, or is too big to compute."""


class CourseError(ToolError):
    """A course change the database refuses."""
