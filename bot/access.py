"""Who may talk to the bot, who is an admin, and when a group message is addressed to the bot.

Access is closed by default. Admins (ADMIN_USER_IDS) may always talk. A user may talk when allowed by
ALLOWED_USER_IDS or by an admin's `/allow ID`; in a group, everyone may talk when the group is allowed
(ALLOWED_CHAT_IDS or `/allow -100…`). A row in `access_list` wins over the environment, so `/deny` can take back
what the environment gave. Every change is written to the audit log in the same transaction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from telegram import Message, MessageEntity

from bot.config import Settings
from migrations import Database

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
        return user_id is not None and user_id in self.settings.admin_user_ids

    async def may_talk(self, user_id: int | None, chat_id: int, chat_type: str) -> bool:
        """Whether a message from `user_id` in chat `chat_id` may reach the model."""
        if user_id is None:
            return False  # channels and anonymous senders: nobody to hold to account
        if self.is_admin(user_id):
            return True
        user_choice = await self._choice("user", user_id)
        if user_choice is not None:
            return user_choice
        if user_id in self.settings.allowed_user_ids:
            return True
        if chat_type in GROUP_TYPES:
            chat_choice = await self._choice("chat", chat_id)
            return chat_choice if chat_choice is not None else chat_id in self.settings.allowed_chat_ids
        return False

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


async def insert_audit(conn: Any, user_id: int | None, chat_id: int | None, action: str, detail: str) -> None:
    """Write one audit row on an open transaction's connection."""
    await conn.execute("INSERT INTO audit_log (user_id, chat_id, action, detail) VALUES (?, ?, ?, ?)",
                       (user_id, chat_id, action, detail))


async def audit(db: Database, user_id: int | None, chat_id: int | None, action: str, detail: str) -> None:
    """Write one audit row in its own transaction."""
    async with db.transaction() as conn:
        await insert_audit(conn, user_id, chat_id, action, detail)


# --- group addressing ------------------------------------------------------------------------------------------

def is_group(message: Message) -> bool:
    """Whether the message comes from a group or supergroup."""
    return message.chat.type in GROUP_TYPES


def addressed_question(message: Message, bot_username: str, bot_id: int) -> str | None:
    """The question in a text message meant for the bot, mention stripped; None when not meant for it.

    In a private chat every message is meant for the bot. In a group it must mention `@bot_username` or reply
    to one of the bot's messages (`/ask` is its own command handler).
    """
    text = message.text or ""
    if not is_group(message):
        return text.strip()
    mention = _mention_of(message, bot_username)
    if mention is not None:
        return _strip_span(text, mention)
    replied = message.reply_to_message
    if replied is not None and replied.from_user is not None and replied.from_user.id == bot_id:
        return text.strip()
    return None


def _mention_of(message: Message, bot_username: str) -> tuple[int, int] | None:
    """(start, end) in Python indices of the first @bot_username mention, from Telegram's entities."""
    wanted = "@" + bot_username.lower()
    for entity, value in message.parse_entities([MessageEntity.MENTION]).items():
        if value.lower() == wanted:
            start = (message.text or "").find(value)
            return start, start + len(value)
    return None


def _strip_span(text: str, span: tuple[int, int]) -> str:
    """Text without the span, with the commas and spaces that went with it tidied ("x, @bot?" → "x?")."""
    left = text[:span[0]].rstrip().rstrip(",，:：").rstrip()
    right = text[span[1]:].lstrip(" ,，:：")
    if not left or not right:
        return (left or right).strip()
    separator = "" if right[0] in "?!.。？！，,;；" else " "
    return re.sub(r"\s{2,}", " ", left + separator + right).strip()
