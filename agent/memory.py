"""Per-session history and turn traces in SQLite.

A turn is written once, when it ends, in one transaction: its question and answer go to `messages` (the history
the model sees next time) and its steps to `turns`/`steps` (for /trace, /stats and audit). `reset` forgets the
history; traces stay. Every text stored passes the process's redactor first (core/secrets.py): a secret that
reached a turn some way (a tool echoing it, a user pasting it) is not kept in the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from agent.llm.base import Message
from agent.steps import Step, StepKind, TurnResult, TurnStatus
from core.secrets import redact
from db import Database

HISTORY_ROWS_SCANNED = 400  # enough for any sane token budget; keeps the query bounded


@dataclass(frozen=True)
class Session:
    """Where a turn happens: `id` keys the history, `chat_key` the tool settings."""

    id: str
    chat_key: str
    kind: str = "private"
    title: str = ""
    chat_id: int | None = None


@dataclass(frozen=True)
class StoredTurn:
    """A finished turn as the database holds it."""

    id: int
    question: str
    answer: str
    status: TurnStatus
    started_at: str
    duration_ms: int
    steps: list[Step]


@dataclass(frozen=True)
class TurnRecord:
    """Everything `save_turn` writes besides the session: who asked, what, and how it went."""

    question: str
    result: TurnResult
    started_at: str
    mode: str = "react"
    user_id: int | None = None
    source_key: str | None = None


def utc_now() -> str:
    """The current time as stored: ISO 8601 in UTC with milliseconds."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Memory:
    """Reads and writes of sessions, history and traces."""

    def __init__(self, db: Database):
        self.db = db

    async def history_window(self, session_id: str, count_tokens: Callable[[str], int], budget: int) -> list[Message]:
        """The newest whole turns of the session that fit in `budget` tokens, oldest first."""
        rows = await self.db.fetchall(
            "SELECT turn_id, role, content FROM messages WHERE session_id = ? ORDER BY id DESC LIMIT ?",
            (session_id, HISTORY_ROWS_SCANNED))
        kept: list[Message] = []
        for turn in _group_by_turn(rows):
            cost = sum(count_tokens(m["content"]) for m in turn)
            if cost > budget:
                break
            budget -= cost
            kept[:0] = turn
        return kept

    async def stored_answer(self, source_key: str) -> str | None:
        """The answer of the turn already stored for this source (e.g. a Telegram update), or None."""
        row = await self.db.fetchone("SELECT answer FROM turns WHERE source_key = ?", (source_key,))
        return None if row is None else str(row[0])

    async def save_turn(self, session: Session, record: TurnRecord, *, to_history: bool = True) -> int:
        """Store a turn, its steps and (when `to_history`) its question and answer, all in one transaction.

        A turn whose `source_key` is already stored is not stored again; its id is returned.
        """
        async with self.db.transaction() as conn:
            if record.source_key:
                async with conn.execute("SELECT id FROM turns WHERE source_key = ?", (record.source_key,)) as cur:
                    existing = await cur.fetchone()
                if existing:
                    return int(existing[0])
            await _upsert_session(conn, session)
            turn_id = await _insert_turn(conn, session.id, record)
            await _insert_steps(conn, turn_id, record.result.steps)
            if to_history:
                await conn.executemany(
                    "INSERT INTO messages (session_id, turn_id, role, content) VALUES (?, ?, ?, ?)",
                    [(session.id, turn_id, "user", redact(record.question)),
                     (session.id, turn_id, "assistant", redact(record.result.answer))])
        return turn_id

    async def reset(self, session_id: str) -> int:
        """Forget a session's history (its traces stay); return how many messages went."""
        async with self.db.transaction() as conn:
            cursor = await conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            return cursor.rowcount

    async def last_turn(self, session_id: str) -> StoredTurn | None:
        """The session's most recent turn with its steps, or None."""
        row = await self.db.fetchone(
            "SELECT id, question, answer, status, started_at, duration_ms FROM turns "
            "WHERE session_id = ? ORDER BY id DESC LIMIT 1", (session_id,))
        if row is None:
            return None
        steps = await self.db.fetchall(
            "SELECT position, kind, thought, action, action_input, observation, error, duration_ms "
            "FROM steps WHERE turn_id = ? ORDER BY position", (row["id"],))
        turn_id, question, answer, status, started_at, duration_ms = row
        return StoredTurn(turn_id, question, answer, TurnStatus(status), started_at, duration_ms,
                          [Step(position, StepKind(kind), *rest) for position, kind, *rest in steps])


def _group_by_turn(rows: Sequence[Any]) -> list[list[Message]]:
    """Rows newest first → turns newest first, each turn's messages in order."""
    turns: list[list[Message]] = []
    last_turn_id: object = object()
    for turn_id, role, content in rows:
        if turn_id != last_turn_id:
            turns.append([])
            last_turn_id = turn_id
        turns[-1].insert(0, {"role": role, "content": content})
    return turns


async def _upsert_session(conn: Any, session: Session) -> None:
    await conn.execute(
        "INSERT INTO sessions (id, chat_id, kind, title) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET title = excluded.title",
        (session.id, session.chat_id, session.kind, session.title))


async def _insert_turn(conn: Any, session_id: str, record: TurnRecord) -> int:
    result = record.result
    cursor = await conn.execute(
        "INSERT INTO turns (session_id, user_id, source_key, question, answer, status, mode, model_calls, "
        "prompt_tokens, completion_tokens, started_at, duration_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (session_id, record.user_id, record.source_key, redact(record.question), redact(result.answer), result.status,
         record.mode, result.model_calls, result.prompt_tokens, result.completion_tokens, record.started_at,
         result.duration_ms))
    return int(cursor.lastrowid)


async def _insert_steps(conn: Any, turn_id: int, steps: Sequence[Step]) -> None:
    await conn.executemany(
        "INSERT INTO steps (turn_id, position, kind, thought, action, action_input, observation, error, duration_ms) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(turn_id, s.position, s.kind, _redacted(s.thought), s.action, _redacted(s.action_input),
          _redacted(s.observation), s.error, s.duration_ms) for s in steps])


def _redacted(text: str | None) -> str | None:
    return None if text is None else redact(text)
