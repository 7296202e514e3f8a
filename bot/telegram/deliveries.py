"""Which pieces of an answer Telegram took, remembered in the database, so that a crash never sends one twice.

An answer is stored (its turn) before it is sent, and its update is marked handled after; a process killed in
between used to send the whole answer again after the restart. Now each piece is written to `answer_deliveries`
(under its turn's key) the moment Telegram's reply to its send arrives, and the restart sends only the pieces not
listed.

The window that is left: Telegram has taken a piece, and the process dies before the row is written (the reply
is in flight, or the write waits its turn). The restart cannot tell that piece from one never sent, and sends it
again. That is the policy, chosen on purpose: a row written *before* the send would turn the same window into an
answer lost for good (listed as sent, never seen); written after, it can only mean a rare double. So the write
goes first in line among the database's writers (`urgent`), and the window is the few milliseconds of one commit.

Writes do not hold up the answer: each runs in its own task, and one that fails (another process holds the
database past its busy timeout) is logged and forgotten; its piece may then be sent twice after a crash, never
lost. Rows are pruned with the update journal (bot/telegram/intake.py), which is as long as they can matter.
"""

from __future__ import annotations

import asyncio
import logging

from telegram import Message

from bot.telegram.streaming import PieceSink
from db import Database

log = logging.getLogger(__name__)


class DeliveryLedger:
    """The `answer_deliveries` table."""

    def __init__(self, db: Database):
        self.db = db
        self._writes: set[asyncio.Task] = set()

    async def delivered(self, source_key: str) -> int:
        """How many leading pieces of the answer stored under `source_key` Telegram took already."""
        rows = await self.db.fetchall("SELECT piece FROM answer_deliveries WHERE source_key = ? ORDER BY piece",
                                      (source_key,))
        count = 0
        for (piece,) in rows:
            if piece != count:
                break  # pieces go out in order; a gap (never written) ends what is known to be through
            count += 1
        return count

    def recorder(self, source_key: str) -> PieceSink:
        """What an answer stream reports its delivered pieces to (bot/telegram/streaming.py `on_delivered`)."""
        async def record(index: int, message: Message) -> None:
            task = asyncio.create_task(self._write(source_key, index, message.chat_id, message.message_id),
                                       name=f"delivery:{source_key}:{index}")
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)
        return record

    async def settled(self) -> None:
        """Wait for the writes under way (for tests, and for a clean shutdown)."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    async def _write(self, source_key: str, piece: int, chat_id: int, message_id: int) -> None:
        try:
            async with self.db.transaction(urgent=True) as conn:
                await conn.execute("INSERT OR REPLACE INTO answer_deliveries (source_key, piece, chat_id, message_id) "
                                   "VALUES (?, ?, ?, ?)", (source_key, piece, chat_id, message_id))
        except Exception as error:  # busy, gone, closed at shutdown: a double after a crash at worst
            log.warning("could not record piece %d of the answer to %s as delivered: %s", piece, source_key, error)
