"""Progress messages a turn leaves on screen, remembered in the database so that none outlives its process.

A turn shows one progress message ("⏳ 正在思考…", then its current step) and deletes it when the answer comes
(bot/telegram/replies.py `TurnFeedback`). A process killed in between never gets to delete it, and the message
would stay in the chat forever; so each one sent is written to `progress_messages`, removed when deleted, and
whatever is still listed at the next start is deleted then (`clean_up`).
"""

from __future__ import annotations

import logging

from telegram import Bot
from telegram.error import BadRequest, Forbidden, TelegramError

from db import Database, DatabaseError

log = logging.getLogger(__name__)


class ProgressLedger:
    """The `progress_messages` table. A failed write is logged, never raised: progress is a courtesy."""

    def __init__(self, db: Database):
        self.db = db

    async def remember(self, chat_id: int, message_id: int) -> None:
        """A progress message was sent."""
        await self._write("INSERT OR IGNORE INTO progress_messages (chat_id, message_id) VALUES (?, ?)",
                          chat_id, message_id)

    async def forget(self, chat_id: int, message_id: int) -> None:
        """A progress message is gone (deleted, or past deleting)."""
        await self._write("DELETE FROM progress_messages WHERE chat_id = ? AND message_id = ?", chat_id, message_id)

    async def clean_up(self, bot: Bot) -> int:
        """Delete the progress messages an earlier process left on screen; how many were listed.

        One Telegram no longer has, or will not let the bot delete (older than 48 hours, the bot blocked), is
        forgotten; one that fails for a network reason stays listed for the next start.
        """
        rows = await self.db.fetchall("SELECT chat_id, message_id FROM progress_messages ORDER BY sent_at")
        for chat_id, message_id in rows:
            try:
                await bot.delete_message(chat_id, message_id)
            except (BadRequest, Forbidden) as error:
                log.info("progress message %s in chat %s cannot be deleted: %s", message_id, chat_id, error)
            except TelegramError as error:
                log.warning("progress message %s in chat %s not deleted yet: %s", message_id, chat_id, error)
                continue
            await self.forget(chat_id, message_id)
        if rows:
            log.info("removed %d progress message(s) left by the previous run", len(rows))
        return len(rows)

    async def _write(self, sql: str, chat_id: int, message_id: int) -> None:
        try:
            async with self.db.transaction() as conn:
                await conn.execute(sql, (chat_id, message_id))
        except DatabaseError as error:
            log.warning("progress message %s in chat %s: %s", message_id, chat_id, error)
