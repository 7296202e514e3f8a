"""Agent options an admin sets per chat (or globally) at run time, over their Settings defaults.

`require_tool_call`, the first-step policy (a question that names a tool's subject must get a tool call before its
final answer), is on or off; `persona` is a text (the chat's persona, added to the system prompt: /persona). A
chat's own value wins over the global one, which wins over the Settings default.
"""

from __future__ import annotations

from db import Database

GLOBAL = "global"
REQUIRE_TOOL_CALL = "require_tool_call"
PERSONA = "persona"
OPTIONS = (REQUIRE_TOOL_CALL,)  # on or off
TEXT_OPTIONS = (PERSONA,)  # a text


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

    async def persona(self, chat_key: str, default: str) -> str:
        """The persona of the chat `chat_key`: its own, else the global one, else `default` (DEFAULT_PERSONA)."""
        value = await self._value(chat_key, PERSONA)
        return default if value is None else value

    async def set(self, name: str, value: bool | None, scope: str = GLOBAL) -> None:
        """Set option `name` on or off for `scope` (a chat key, or GLOBAL); None returns it to the default."""
        if name not in OPTIONS:
            raise KeyError(name)
        await self._write(name, None if value is None else ("on" if value else "off"), scope)

    async def set_text(self, name: str, value: str | None, scope: str = GLOBAL) -> None:
        """Set the text option `name` (the persona) for `scope`; None returns it to the default."""
        if name not in TEXT_OPTIONS:
            raise KeyError(name)
        await self._write(name, value, scope)

    async def _write(self, name: str, value: str | None, scope: str) -> None:
        async with self.db.transaction() as conn:
            if value is None:
                await conn.execute("DELETE FROM chat_options WHERE scope = ? AND name = ?", (scope, name))
                return
            await conn.execute(
                "INSERT INTO chat_options (scope, name, value) VALUES (?, ?, ?) "
                "ON CONFLICT (scope, name) DO UPDATE SET value = excluded.value, "
                "updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
                (scope, name, value))

    async def _value(self, chat_key: str, name: str) -> str | None:
        rows = await self._rows(chat_key, name)
        return rows.get(chat_key, rows.get(GLOBAL))

    async def _rows(self, chat_key: str, name: str) -> dict[str, str]:
        rows = await self.db.fetchall(
            "SELECT scope, value FROM chat_options WHERE name = ? AND scope IN (?, ?)", (name, chat_key, GLOBAL))
        return {scope: value for scope, value in rows}
