"""Who may talk to the bot and who is an admin: policy only (whether a message is meant for the bot is decided
with the question, in bot/telegram/questions.py).

Access is closed by default. Admins (ADMIN_USER_IDS) may always talk. A user may talk when allowed by
ALLOWED_USER_IDS or by an admin's `/allow ID`; in a group, everyone may talk when the group is allowed
(ALLOWED_CHAT_IDS or `/allow -100…`). A row in `access_list` wins over the environment, so `/deny` can take back
what the environment gave. Every change is written to the audit log in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.program.audit import insert_audit
from bot.program.config import Settings
from bot.program.ids import is_service_account
from db import Database

GROUP_TYPES = ("group", "supergroup")


@dataclass(frozen=True)
class AccessEntry:
    """One run-time access decision an admin made."""

    kind: str  # user or chat
    subject_id: int
    allowed: bool
    changed_by: int | None
    changed_at: str


def subject_kind(subject_id: int) -> str:
    """Telegram's ids say what they are: users are positive, groups and channels negative."""
    return "user" if subject_id > 0 else "chat"


class AccessControl:
    """Access decisions from the settings and the `access_list` table."""

    def __init__(self, db: Database, settings: Settings):
        self.db = db
        self.settings = settings

    def is_admin(self, user_id: int | None) -> bool:
        """Whether `user_id` is listed in ADMIN_USER_IDS."""
        return user_id is not None and user_id in self.settings.access.admin_user_ids

    async def may_talk(self, user_id: int | None, chat_id: int, chat_type: str) -> bool:
        """Whether a message from `user_id` in chat `chat_id` may reach the model."""
        if user_id is None:
            return False  # channels and anonymous senders: nobody to hold to account
        if self.is_admin(user_id):
            return True
        # A service account (an anonymous admin, a channel) stands for many senders: only a group's own access
        # lets it in, in that group; an old `/allow` of its id (refused since, bot/program/ids.py) does not.
        if not is_service_account(user_id):
            user_choice = await self._choice("user", user_id)
            if user_choice is not None:
                return user_choice
            if user_id in self.settings.access.allowed_user_ids:
                return True
        return await self.chat_allowed(chat_id, chat_type)

    async def chat_allowed(self, chat_id: int, chat_type: str) -> bool:
        """Whether a group is allowed as a whole (everyone in it may talk); a private chat never is by itself."""
        if chat_type not in GROUP_TYPES:
            return False
        chat_choice = await self._choice("chat", chat_id)
        return chat_choice if chat_choice is not None else chat_id in self.settings.access.allowed_chat_ids

    async def _choice(self, kind: str, subject_id: int) -> bool | None:
        row = await self.db.fetchone("SELECT allowed FROM access_list WHERE kind = ? AND subject_id = ?",
                                     (kind, subject_id))
        return None if row is None else bool(row[0])

    async def set_allowed(self, subject_id: int, allowed: bool, *, by: int, chat_id: int | None) -> str:
        """Allow or deny a user (positive id) or a chat (negative id); audited. Returns the kind."""
        kind = subject_kind(subject_id)
        async with self.db.transaction() as conn:
            await conn.execute(
                "INSERT INTO access_list (kind, subject_id, allowed, changed_by) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (kind, subject_id) DO UPDATE SET allowed = excluded.allowed, "
                "changed_by = excluded.changed_by, changed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
                (kind, subject_id, int(allowed), by))
            await insert_audit(conn, by, chat_id, "allow" if allowed else "deny", f"{kind} {subject_id}")
        return kind

    async def entries(self) -> list[AccessEntry]:
        """Every run-time decision, users first."""
        rows = await self.db.fetchall(
            "SELECT kind, subject_id, allowed, changed_by, changed_at FROM access_list "
            "ORDER BY kind DESC, subject_id")
        return [AccessEntry(kind, subject_id, bool(allowed), by, at) for kind, subject_id, allowed, by, at in rows]

