"""The audit log: who changed what, written by the Telegram admin commands and by `qwenbot mcp` alike.

It lives with the program rather than the Telegram adapter because the terminal commands write it too, and they
do not load python-telegram-bot.
"""

from __future__ import annotations

from typing import Any

from core.secrets import redact
from db import Database


async def insert_audit(conn: Any, user_id: int | None, chat_id: int | None, action: str, detail: str) -> None:
    """Write one audit row on an open transaction's connection (secrets redacted from its detail)."""
    await conn.execute("INSERT INTO audit_log (user_id, chat_id, action, detail) VALUES (?, ?, ?, ?)",
                       (user_id, chat_id, action, redact(detail)))


async def audit(db: Database, user_id: int | None, chat_id: int | None, action: str, detail: str) -> None:
    """Write one audit row in its own transaction."""
    async with db.transaction() as conn:
        await insert_audit(conn, user_id, chat_id, action, detail)
