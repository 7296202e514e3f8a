"""The tool registry: what the model may call, how it is described, and a call that never raises.

A tool is a plain `async def` returning text, plus its description and a JSON Schema for its arguments.
`ToolRegistry.call` validates arguments with jsonschema and runs the tool under a time limit. Whatever goes
wrong (unknown tool, bad arguments, an exception, a time-out) comes back as a `ToolResult` the model can read.
Every secret the process knows is redacted from that text (core/secrets.py) before anyone reads it: a tool that
echoes its request (an MCP server showing the headers it got) must not hand the model a token to repeat.

A tool may narrow itself at the start of each turn (`Tool.narrow`): `course_query` offers the course names in the
database as an enum, so a model decoding under the turn's grammar cannot invent a course. The narrowed schema is
what the model is shown and held to; arguments are still validated against the declared one.

A tool that answers per chat (`Tool.chat_scoped`: the documents tools, which show each chat only the documents it
may see) gets the turn's chat key from the registry as the keyword `chat_key`, never from the model: the model's
arguments are validated against the schema, which does not have it. Such a tool may also say whether it has
anything to offer in a chat (`Tool.offered_in`); where it has nothing, it is left out of the turn.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Iterator

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from core.secrets import redact
from tools.errors import ToolError

log = logging.getLogger(__name__)

ToolFunction = Callable[..., Awaitable[str]]
BeforeRun = Callable[["Tool", dict[str, Any]], Awaitable[None]]
BUILT_IN = "built-in"


@dataclass(frozen=True)
class Tool:
    """A callable tool: the async function and how the model sees it."""

    name: str  # name_for_model
    human_name: str  # name_for_human
    description: str  # description_for_model
    parameters: dict[str, Any]  # JSON Schema of an object
    function: ToolFunction
    progress: str = "🛠"  # shown to the user while the tool runs, e.g. "🔎 查询课程数据库"
    enabled_by_default: bool = True
    source: str = BUILT_IN  # where the tool comes from: built-in, or "mcp:SERVER"
    read_only: bool = True  # False: the tool may change data (enabling it takes an admin's explicit flag)
    destructive: bool = False  # the server says it may delete or overwrite data (implies not read_only)
    # Words that name what the tool is about: a question holding one "names the tool's subject" (the policy that
    # can require a tool call before the final answer). Compared case-insensitively.
    subjects: tuple[str, ...] = ()
    # Called at the start of each turn with the tool itself: the tool as the model sees it in that turn.
    narrow: Callable[["Tool"], Awaitable["Tool"]] | None = None
    # The registry passes the turn's chat key as `chat_key=` (None outside a chat): what the tool shows depends on it.
    chat_scoped: bool = False
    # Whether the tool has anything to offer in a chat (by chat key); an enabled tool that has not is left out.
    offered_in: Callable[[str], Awaitable[bool]] | None = None

    @property
    def access(self) -> str:
        """What the tool may do to data, in one word: read-only, writes, or destructive."""
        return "read-only" if self.read_only else "destructive" if self.destructive else "writes"

    def __post_init__(self) -> None:
        Draft202012Validator.check_schema(self.parameters)

    async def offered(self, chat_key: str) -> bool:
        """Whether the tool has anything to offer in the chat `chat_key` (always, unless it says otherwise)."""
        return await self.offered_in(chat_key) if self.offered_in is not None else True

    async def for_turn(self) -> "Tool":
        """The tool as the model sees it in a turn starting now (narrowed, if the tool narrows itself)."""
        return await self.narrow(self) if self.narrow is not None else self

    def named_in(self, text: str) -> bool:
        """Whether `text` names this tool's subject."""
        folded = text.casefold()
        return any(word.casefold() in folded for word in self.subjects if word)

    @property
    def parameter_list(self) -> list[dict[str, Any]]:
        """The schema in the article's list form: name, description, required, schema."""
        required = set(self.parameters.get("required", ()))
        return [
            {
                "name": name,
                "description": spec.get("description", ""),
                "required": name in required,
                "schema": {k: v for k, v in spec.items() if k != "description"},
            }
            for name, spec in self.parameters.get("properties", {}).items()
        ]

    @property
    def single_parameter(self) -> str | None:
        """The name of the only parameter, when there is exactly one (a plain string can then stand for it)."""
        names = list(self.parameters.get("properties", {}))
        return names[0] if len(names) == 1 else None

    def openai_spec(self) -> dict[str, Any]:
        """The tool as an OpenAI-style function spec, for native tool calling."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


async def tools_for_turn(tools: Iterable[Tool]) -> list[Tool]:
    """`tools` as the model sees them in a turn starting now."""
    return [await tool.for_turn() for tool in tools]


@dataclass(frozen=True)
class ToolResult:
    """What a call produced: `output` is always text the model can read; `error` names what went wrong."""

    tool: str
    arguments: Any
    output: str
    error: str | None = None  # unknown_tool, invalid_arguments, tool_error, unavailable, exception, timeout
    duration_ms: int = 0

    @property
    def ok(self) -> bool:
        """Whether the tool ran and returned normally."""
        return self.error is None


TOOL_TIMEOUT_SECONDS = 10.0  # how long one tool call may take (the default of TOOL_TIMEOUT_SECONDS)


@dataclass
class ToolRegistry:
    """The tools the bot knows, by name."""

    tools: dict[str, Tool] = field(default_factory=dict)
    timeout_seconds: float = TOOL_TIMEOUT_SECONDS

    @classmethod
    def of(cls, tools: Iterable[Tool], timeout_seconds: float = TOOL_TIMEOUT_SECONDS) -> "ToolRegistry":
        """A registry holding `tools`."""
        registry = cls(timeout_seconds=timeout_seconds)
        for tool in tools:
            registry.register(tool)
        return registry

    def register(self, tool: Tool) -> None:
        """Add a tool; two tools with one name is a programming error."""
        if tool.name in self.tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
        self.tools[tool.name] = tool

    def replace_source(self, source: str, tools: Iterable[Tool]) -> None:
        """Swap every tool from `source` (an MCP server's, after a new listing) for `tools`."""
        for name in [t.name for t in self.tools.values() if t.source == source]:
            del self.tools[name]
        for tool in tools:
            self.register(tool)

    def from_source(self, source: str) -> list[Tool]:
        """The tools that come from `source`, in registration order."""
        return [tool for tool in self.tools.values() if tool.source == source]

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def get(self, name: str) -> Tool | None:
        """The tool called `name`, or None."""
        return self.tools.get(name)

    @property
    def names(self) -> list[str]:
        """Tool names in registration order."""
        return list(self.tools)

    async def call(self, name: str, arguments: Any, allowed: Iterable[str] | None = None, *,
                   before_run: BeforeRun | None = None, chat_key: str | None = None) -> ToolResult:
        """Run tool `name` with `arguments`; every failure comes back as a readable result, never raised.
        `before_run` is awaited once the call is known to run (the tool exists, is allowed, arguments fit);
        `chat_key` (the turn's chat) goes to a chat-scoped tool."""
        started = time.perf_counter()
        allowed = None if allowed is None else list(allowed)  # a generator would be spent by the check
        tool = self.tools.get(name)
        if tool is None or (allowed is not None and name not in allowed):
            available = ", ".join(allowed if allowed is not None else self.names) or "none"
            return ToolResult(name, arguments, f"Error: there is no tool named {name!r}. Available tools: {available}.",
                              "unknown_tool")
        problem = validation_problem(tool, arguments)
        if problem:
            return ToolResult(name, arguments, f"Error: invalid arguments for {name}: {problem}", "invalid_arguments")
        if before_run is not None:
            await before_run(tool, arguments)
        given = {**arguments, "chat_key": chat_key} if tool.chat_scoped else arguments
        output, error = await self._run(tool, given)
        return ToolResult(name, arguments, redact(output), error, int((time.perf_counter() - started) * 1000))

    async def _run(self, tool: Tool, arguments: dict[str, Any]) -> tuple[str, str | None]:
        try:
            output = await asyncio.wait_for(tool.function(**arguments), self.timeout_seconds)
        except asyncio.TimeoutError:
            return f"Error: {tool.name} did not finish within {self.timeout_seconds:g} seconds.", "timeout"
        except ToolError as error:
            return f"Error: {error}", error.kind
        except Exception as error:  # the tool's failure is the model's observation, and our log line
            log.warning("tool %s failed: %r", tool.name, error, exc_info=True)
            return f"Error: {tool.name} failed: {type(error).__name__}: {error}", "exception"
        return (output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)), None


def validation_problem(tool: Tool, arguments: Any) -> str | None:
    """Why `arguments` do not fit the tool's schema (the first reason, in words), or None when they fit."""
    if not isinstance(arguments, dict):
        return f"expected a JSON object, got {type(arguments).__name__}"
    error = best_match(Draft202012Validator(tool.parameters).iter_errors(arguments))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message
