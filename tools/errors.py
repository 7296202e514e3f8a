"""Errors tools raise on purpose.

    ToolError               a tool refuses its input; the message is written for whoever gave it
    ├── CalculationError    not plain arithmetic, or too big to compute
    ├── CourseError         an invalid course change (empty name, negative lessons, unknown course)
    └── McpToolError        an MCP server's tool answered with an error, or changed its parameters
        └── ServerUnavailable   the MCP server cannot be reached, hung up, or is waiting to be retried

    McpConfigError          MCP_CONFIG_PATH or an admin's server definition cannot be used (not a tool failure)

The registry turns a `ToolError` into an observation the model can act on (error kind: the class's `kind`,
`tool_error` unless it says otherwise); any other exception from a tool is logged as a bug and reported to the
model as `exception`.
"""


class ToolError(ValueError):
    """A tool refuses its input."""

    kind = "tool_error"  # what the step records as its error


class CalculationError(ToolError):
    """The expression is not plain arithmetic, or is too big to compute."""


class CourseError(ToolError):
    """A course change the database refuses."""


class McpToolError(ToolError):
    """An MCP tool answered with an error (`isError`), or its server refused the call."""


class ServerUnavailable(McpToolError):
    """The MCP server cannot be reached, hung up mid-call, or failed recently and waits before the next try."""

    kind = "unavailable"


class McpConfigError(ValueError):
    """An MCP server definition (the config file, or /mcp_add's arguments) cannot be used; the message says why."""
