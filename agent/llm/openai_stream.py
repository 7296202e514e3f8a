"""One streamed chat completion, read chunk by chunk: the pieces it is made of, and the time limits it runs under.

A real server on a slow machine can take minutes before its first token (a long prompt, or a queue: llama.cpp's
Python server answers one request at a time) and then stream steadily, so one deadline per call is wrong both
ways: too short for the wait, too long for a server that died mid-answer. The limits are therefore three:

    connect      the TCP (and TLS) connection must open within it: a host that is down fails fast
    first token  from the request to the first generated text (or tool call): waiting in line and prompt processing
    silence      the longest pause between two chunks once text flows: a server that stalls mid-answer

The client's own retries (429, 5xx, dropped connections, honouring Retry-After) happen before any text arrives, so
they count against the first-token limit. Keep-alive comments a server sends while it works (sse-starlette pings
every 15 s) are not chunks: they neither start the answer nor break a silence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StreamLimits:
    """The time limits of one streamed call, in seconds (see the module docstring)."""

    connect_seconds: float = 10.0
    first_token_seconds: float = 120.0
    silence_seconds: float = 30.0


@dataclass(frozen=True)
class ServerLimits:
    """How the openai backend waits for its server and retries it (agent/llm/openai.py's docstring says how); the
    one place of these defaults (OPENAI_STARTUP_SECONDS, OPENAI_SERVER_WAIT_SECONDS, OPENAI_MAX_RETRIES and
    OPENAI_LOW_PRIORITY_CONCURRENCY read them here)."""

    startup_seconds: float = 60.0
    server_wait_seconds: float = 0.0
    max_retries: int = 3
    low_priority_concurrency: int = 1


@dataclass
class _ToolCallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamedReply:
    """What the chunks of one streamed chat completion add up to so far."""

    parts: list[str] = field(default_factory=list)
    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Any = None
    started: bool = False  # generated text or a tool call has arrived (the first-token limit is met)

    @property
    def text(self) -> str:
        """The generated text so far."""
        return "".join(self.parts)

    def add(self, chunk: Any) -> str:
        """Take one chunk; return the new text it carries ('' for role, tool-call, finish and usage chunks)."""
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        choices = getattr(chunk, "choices", None) or []
        if not choices:
            return ""
        choice = choices[0]
        self.finish_reason = choice.finish_reason or self.finish_reason
        delta = choice.delta
        if delta is None:
            return ""
        for call in delta.tool_calls or ():
            self._add_tool_call(call)
        text = delta.content or ""
        if text:
            self.parts.append(text)
            self.started = True
        return text

    def _add_tool_call(self, call: Any) -> None:
        # OpenAI's shape: the first delta of a call carries its id and name, later ones pieces of its arguments.
        parts = self.tool_calls.setdefault(call.index if call.index is not None else len(self.tool_calls),
                                           _ToolCallParts())
        parts.id = parts.id or (call.id or "")
        function = call.function
        if function is not None:
            parts.name += function.name or ""
            if function.arguments:
                parts.arguments.append(function.arguments)
        self.started = True

    def calls(self) -> list[tuple[str, str, str]]:
        """The finished tool calls as (id, name, arguments JSON text), in index order."""
        return [(parts.id, parts.name, "".join(parts.arguments) or "{}")
                for _, parts in sorted(self.tool_calls.items()) if parts.name]
