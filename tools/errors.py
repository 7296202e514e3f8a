"""Errors tools raise on purpose (the whole tree, with its root, is drawn in core/errors.py).

    ToolError               a tool refuses its input; the message is written for whoever gave it
    ├── UnknownTool         no registered tool has that name (also a KeyError, for lookups)
    ├── CalculationError    not plain arithmetic, or too big to compute
    ├── CourseError         an invalid course change (empty name, negative lessons, unknown course)
    ├── DocumentError       a document that cannot be added (type, size, no text, a zip bomb, the budget), or an
    │                       unknown document id
    └── McpToolError        an MCP server's tool answered with an error, or changed its parameters
        └── ServerUnavailable   the MCP server cannot be reached, hung up, or is waiting to be retried

    ConfirmationNeeded      enabling a tool that may change data needs the admin's explicit flag (not a tool failure)
    McpConfigError          MCP_CONFIG_PATH or an admin's server definition cannot be used (not a tool failure)
    └── PrivateAddress      an admin-added server's host resolves to a loopback, private or link-local address

The registry turns a `ToolError` into an observation the model can act on (error kind: the class's `kind`,
`tool_error` unless it says otherwise); any other exception from a tool is logged as a bug and reported to the
model as `exception`.
"""

from typing import Any

from core.errors import BotError


class ToolError(BotError, ValueError):
    """A tool refuses its input."""

    kind = "tool_error"  # what the step records as its error


class UnknownTool(ToolError, KeyError):
    """No registered tool has this name."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else ""


class CalculationError(ToolError):
    """The expression is not plain arithmetic, or is too big to compute."""


class CourseError(ToolError):
    """A course change the database refuses."""


class DocumentError(ToolError):
    """A document the library refuses, or one it does not have; the message is one line saying why."""


class McpToolError(ToolError):
    """An MCP tool answered with an error (`isError`), or its server refused the call."""


class ServerUnavailable(McpToolError):
    """The MCP server cannot be reached, hung up mid-call, or failed recently and waits before the next try."""

    kind = "unavailable"


class ConfirmationNeeded(BotError, PermissionError):
    """Enabling a tool that may change data takes the admin's explicit flag."""

    def __init__(self, tool: Any):
        super().__init__(f"{tool.name} is {tool.access}: it may change data")
        self.tool = tool


class McpConfigError(BotError, ValueError):
    """An MCP server definition (the config file, or /mcp_add's arguments) cannot be used; the message says why."""


class PrivateAddress(McpConfigError):
    """An admin-added MCP server resolves to an address that is not public (tools/mcp_addresses.py)."""
