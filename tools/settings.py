"""Which tools are enabled where, persisted in `tool_settings`; and the audit of calls to tools that change data.

A chat's own setting wins over the global one, which wins over the tool's default. A tool that may change data
(an MCP tool its server does not mark read-only) is enabled only with an explicit confirmation, and every call to
it is written to the audit log with its arguments before it runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from core.secrets import redact
from db import Database
from tools.errors import ConfirmationNeeded, UnknownTool
from tools.registry import Tool, ToolRegistry

GLOBAL = "global"


@dataclass(frozen=True)
class ToolState:
    """A tool's effective state in one chat, and where it comes from."""

    tool: Tool
    enabled: bool
    source: str  # "chat", "global" or "default"


class ToolSettings:
    """Enable and disable tools globally or per chat."""

    def __init__(self, db: Database, registry: ToolRegistry):
        self.db = db
        self.registry = registry

    async def states(self, chat_key: str) -> list[ToolState]:
        """Every registered tool's effective state in the chat `chat_key`."""
        rows = await self.db.fetchall(
            "SELECT scope, tool_name, enabled FROM tool_settings WHERE scope IN (?, ?)", (GLOBAL, chat_key))
        chosen = {(scope, name): bool(enabled) for scope, name, enabled in rows}
        return [self._state(tool, chosen, chat_key) for tool in self.registry]

    @staticmethod
    def _state(tool: Tool, chosen: dict[tuple[str, str], bool], chat_key: str) -> ToolState:
        own = "global" if chat_key == GLOBAL else "chat"  # `qwenbot tools` asks for the global scope itself
        for scope, source in ((chat_key, own), (GLOBAL, "global")):
            if (scope, tool.name) in chosen:
                return ToolState(tool, chosen[(scope, tool.name)], source)
        return ToolState(tool, tool.enabled_by_default, "default")

    async def enabled_tools(self, chat_key: str) -> list[Tool]:
        """The tools the model may use in the chat `chat_key`: enabled there, and with something to offer there
        (the documents tools, where the chat can see a document)."""
        states = await self.states(chat_key)
        return [state.tool for state in states if state.enabled and await state.tool.offered(chat_key)]

    async def set_enabled(self, tool_name: str, enabled: bool, scope: str = GLOBAL, *,
                          confirmed: bool = False) -> None:
        """Turn a tool on or off for `scope` (a chat key, or GLOBAL); unknown names are refused (UnknownTool), and
        so is turning on a tool that may change data unless `confirmed` (ConfirmationNeeded)."""
        tool = self.registry.get(tool_name)
        if tool is None:
            raise UnknownTool(f"no tool named {tool_name!r}")
        if enabled and not tool.read_only and not confirmed:
            raise ConfirmationNeeded(tool)
        async with self.db.transaction() as conn:
            await conn.execute(
                "INSERT INTO tool_settings (scope, tool_name, enabled) VALUES (?, ?, ?) "
                "ON CONFLICT (scope, tool_name) DO UPDATE SET enabled = excluded.enabled, "
                "updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
                (scope, tool_name, int(enabled)))

    async def audit_call(self, tool: Tool, arguments: Any, user_id: int | None, chat_id: int | None,
                         chat_key: str) -> None:
        """Record a call to a tool that may change data, with its arguments, before it runs."""
        detail = redact(f"{tool.name} {json.dumps(arguments, ensure_ascii=False, sort_keys=True)} in {chat_key}")
        async with self.db.transaction() as conn:
            await conn.execute("INSERT INTO audit_log (user_id, chat_id, action, detail) VALUES (?, ?, ?, ?)",
                               (user_id, chat_id, "tool_call", detail))
