"""A group upgraded to a supergroup: Telegram gives it a new id, and the bot carries the group over.

Telegram announces the upgrade twice, both as service messages: `migrate_to_chat_id` in the old group and
`migrate_from_chat_id` in the new supergroup. Whichever arrives first moves, in one transaction, everything keyed
by the old id: the group's access entry (an admin's `/allow`, or ALLOWED_CHAT_IDS turned into an entry, since the
environment cannot be rewritten), its history and traces (sessions `tg:<id>` and `tg:<id>:<topic>`), its tool
settings and the documents searchable there only. The second finds nothing left to move. Without this a group
allowed yesterday is refused today, and loses its history.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from bot.program.audit import insert_audit
from bot.telegram.access import AccessControl
from bot.telegram.chat import chat_key
from db import Database

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CarriedOver:
    """What moved from the old group id to the new one."""

    access: str  # "allowed", "denied", "allowed (ALLOWED_CHAT_IDS)" or "none"
    sessions: int
    tool_settings: int
    documents: int = 0

    @property
    def anything(self) -> bool:
        """Whether anything moved (the second announcement finds nothing)."""
        return self.access != "none" or self.sessions > 0 or self.tool_settings > 0 or self.documents > 0


async def carry_over(db: Database, access: AccessControl, old_id: int, new_id: int) -> CarriedOver:
    """Move the access entry, history and tool settings of group `old_id` to supergroup `new_id`; audited."""
    async with db.transaction() as conn:
        moved = CarriedOver(await _move_access(conn, access, old_id, new_id),
                            await _move_sessions(conn, old_id, new_id),
                            await _move_tool_settings(conn, old_id, new_id),
                            await _move_documents(conn, old_id, new_id))
        if moved.anything:
            await insert_audit(conn, None, new_id, "chat_migrated",
                               f"chat {old_id} -> {new_id}: access {moved.access}, {moved.sessions} session(s), "
                               f"{moved.tool_settings} tool setting(s)"
                               + (f", {moved.documents} document(s)" if moved.documents else ""))
    if moved.anything:
        log.info("group %s became supergroup %s; carried over: access %s, %d session(s), %d tool setting(s)",
                 old_id, new_id, moved.access, moved.sessions, moved.tool_settings)
    if moved.access.endswith("(ALLOWED_CHAT_IDS)"):
        log.warning("group %s is now supergroup %s: put %s in ALLOWED_CHAT_IDS in place of %s (it is allowed by an "
                    "access entry meanwhile)", old_id, new_id, new_id, old_id)
    return moved


async def _move_access(conn: Any, access: AccessControl, old_id: int, new_id: int) -> str:
    """The old id's entry goes to the new id, unless the new id has its own already."""
    async with conn.execute("SELECT allowed, changed_by FROM access_list WHERE kind = 'chat' AND subject_id = ?",
                            (old_id,)) as cursor:
        row = await cursor.fetchone()
    if row is not None:
        await conn.execute("INSERT OR IGNORE INTO access_list (kind, subject_id, allowed, changed_by) "
                           "VALUES ('chat', ?, ?, ?)", (new_id, row[0], row[1]))
        await conn.execute("DELETE FROM access_list WHERE kind = 'chat' AND subject_id = ?", (old_id,))
        return "allowed" if row[0] else "denied"
    if old_id in access.settings.access.allowed_chat_ids and new_id not in access.settings.access.allowed_chat_ids:
        cursor = await conn.execute("INSERT OR IGNORE INTO access_list (kind, subject_id, allowed) "
                                    "VALUES ('chat', ?, 1)", (new_id,))
        if cursor.rowcount:
            return "allowed (ALLOWED_CHAT_IDS)"
    return "none"


async def _move_sessions(conn: Any, old_id: int, new_id: int) -> int:
    """Every session of the old chat (and of its topics) becomes the same session of the new chat."""
    old_key, new_key = chat_key(old_id), chat_key(new_id)
    async with conn.execute("SELECT id FROM sessions WHERE id = ? OR id LIKE ? ESCAPE '\\'",
                            (old_key, _like_prefix(old_key + ":"))) as cursor:
        old_sessions = [row[0] for row in await cursor.fetchall()]
    for old_session in old_sessions:
        new_session = new_key + old_session[len(old_key):]
        await conn.execute("INSERT OR IGNORE INTO sessions (id, chat_id, kind, title, created_at) "
                           "SELECT ?, ?, 'supergroup', title, created_at FROM sessions WHERE id = ?",
                           (new_session, new_id, old_session))
        for table in ("messages", "turns"):  # a fixed list: no user text in the statement
            await conn.execute(f"UPDATE {table} SET session_id = ? WHERE session_id = ?", (new_session, old_session))
        await conn.execute("UPDATE OR IGNORE session_summaries SET session_id = ? WHERE session_id = ?",
                           (new_session, old_session))
        await conn.execute("DELETE FROM sessions WHERE id = ?", (old_session,))
    return len(old_sessions)


async def _move_tool_settings(conn: Any, old_id: int, new_id: int) -> int:
    """The old chat's own tool settings and options, where the new chat has none of its own."""
    old_key, new_key = chat_key(old_id), chat_key(new_id)
    cursor = await conn.execute("INSERT OR IGNORE INTO tool_settings (scope, tool_name, enabled, updated_at) "
                                "SELECT ?, tool_name, enabled, updated_at FROM tool_settings WHERE scope = ?",
                                (new_key, old_key))
    moved = max(cursor.rowcount, 0)
    await conn.execute("DELETE FROM tool_settings WHERE scope = ?", (old_key,))
    # The chat's own agent options (the first-step policy, the persona) go with them.
    cursor = await conn.execute("INSERT OR IGNORE INTO chat_options (scope, name, value, updated_at) "
                                "SELECT ?, name, value, updated_at FROM chat_options WHERE scope = ?",
                                (new_key, old_key))
    moved += max(cursor.rowcount, 0)
    await conn.execute("DELETE FROM chat_options WHERE scope = ?", (old_key,))
    return moved


async def _move_documents(conn: Any, old_id: int, new_id: int) -> int:
    """Documents searchable in the old chat only become searchable in the new one (a name the new chat has
    already keeps the new chat's document: the old one stays under its old key, where /docs all shows it)."""
    cursor = await conn.execute(
        "UPDATE OR IGNORE documents SET scope = ? WHERE scope = ?", (chat_key(new_id), chat_key(old_id)))
    return max(cursor.rowcount, 0)


def _like_prefix(prefix: str) -> str:
    """A LIKE pattern matching strings that start with `prefix` (its % and _ taken literally)."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
