"""Agent options an admin sets per chat (or globally) at run time, over their Settings defaults.

One so far: `require_tool_call`, the first-step policy (a question that names a tool's subject must get a tool
call before its final answer). A chat's own value wins over the global one, which wins over the Settings default.
"""

from __future__ import annotations

from db import Database

GLOBAL = "global"
REQUIRE_TOOL_CALL = "require_tool_call"
OPTIONS = (REQUIRE_TOOL_CALL,)


class ChatOptions:
    """Options per chat in the `chat_options` table."""

    def __init__(self, db: Database):
        self.db = db

    async def require_tool_call(self, chat_key: str, default: bool) -> bool:
        """The first-step policy in the chat `chat_key`: its own value, else the global one, else `default`."""
        value = await self._value(chat_key, REQUIRE_TOOL_CALL)
        return default if value is None else value == "on"

    async def source(self, chat_key: str, name: str) -> str:
        """Where a chat's value of option `name` comes from: 'chat', 'global' or 'default'."""
        rows = await self._rows(chat_key, name)
        return "chat" if chat_key in rows and chat_key != GLOBAL else "global" if GLOBAL in rows else "default"

    async def set(self, name: str, value: bool | None, scope: str = GLOBAL) -> None:
        """Set option `name` on or off for `scope` (a chat key, or GLOBAL); None returns it to the default."""
        if name not in OPTIONS:
            raise KeyError(name)
        async with self.db.transaction() as conn:
            if value is None:
                await conn.execute("DELETE FROM chat_options WHERE scope = ? AND name = ?", (scope, name))
                return
            await conn.execute(
                "INSERT INTO chat_options (scope, name, value) VALUES (?, ?, ?) "
                "ON CONFLICT (scope, name) DO UPDATE SET value = excluded.value, "
                "updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
                (scope, name, "on" if value else "off"))

    async def _value(self, chat_key: str, name: str) -> str | None:
        rows = await self._rows(chat_key, name)
        return rows.get(chat_key, rows.get(GLOBAL))

    async def _rows(self, chat_key: str, name: str) -> dict[str, str]:
        rows = await self.db.fetchall(
            "SELECT scope, value FROM chat_options WHERE name = ? AND scope IN (?, ?)", (name, chat_key, GLOBAL))
        return {scope: value for scope, value in rows}
