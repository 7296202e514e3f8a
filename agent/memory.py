"""Per-session history, its running summary, and turn traces in SQLite.

A turn is written once, when it ends, in one transaction: its question and answer go to `messages` (the history
the model sees next time) and its steps to `turns`/`steps` (for /trace, /stats and audit). A long history's oldest
turns are folded into the session's summary (`session_summaries`, written by agent/summaries.py): the window the
model sees starts after the summary's last turn. `reset` forgets the history and its summary; traces stay. Every
text stored passes the process's redactor first (core/secrets.py): a secret that reached a turn some way (a tool
echoing it, a user pasting it) is not kept in the database.

A turn records how it was asked (`input_kind`: typed, spoken, or about a photo). A question about a photo is kept in
the history with a note that a picture came with it, never the picture: a later question ("and the other one?")
then reads as what it is, and the model does not claim to still see it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

from agent.llm.base import Message
from agent.steps import TOOL_KINDS, Step, StepKind, TurnResult, TurnStatus
from core.secrets import redact
from db import Database

HISTORY_ROWS_SCANNED = 400  # enough for any sane token budget; keeps the query bounded
INPUT_KINDS = ("text", "voice", "photo")
# What the history keeps of a question asked about a picture: a note before its text.
PICTURE_NOTE = "[image attached to this question; no longer visible] "


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
    input_kind: str = "text"


@dataclass(frozen=True)
class TurnRecord:
    """Everything `save_turn` writes besides the session: who asked, what, and how it went."""

    question: str
    result: TurnResult
    started_at: str
    mode: str = "react"
    user_id: int | None = None
    source_key: str | None = None
    input_kind: str = "text"  # one of INPUT_KINDS

    @property
    def history_question(self) -> str:
        """The question as the history keeps it (with the note of a picture, for a question about one)."""
        return PICTURE_NOTE + self.question if self.input_kind == "photo" else self.question


@dataclass(frozen=True)
class Summary:
    """A session's running summary: the turns up to `through_turn_id`, folded into `text` in `language`."""

    text: str
    through_turn_id: int
    folded_turns: int
    language: str
    updated_at: str = ""


@dataclass(frozen=True)
class PastTurn:
    """One turn of the history: its id and its messages (the question, the answer)."""

    turn_id: int
    messages: list[Message]

    def cost(self, count_tokens: Callable[[str], int]) -> int:
        """Its tokens, as `count_tokens` counts them."""
        return sum(count_tokens(m["content"]) for m in self.messages)


@dataclass(frozen=True)
class HistoryView:
    """What the model may see of a session's past: its summary (if any) and the newest whole turns after it that
    fit the budget, oldest first."""

    summary: Summary | None
    turns: list[PastTurn]

    @property
    def messages(self) -> list[Message]:
        """The window's messages, oldest first (the summary is not among them)."""
        return [message for turn in self.turns for message in turn.messages]


@dataclass(frozen=True)
class ExportedTurn:
    """A turn of the history as /export writes it."""

    id: int
    question: str
    answer: str
    started_at: str
    duration_ms: int
    user_id: int | None
    steps: list[Step]


def utc_now() -> str:
    """The current time as stored: ISO 8601 in UTC with milliseconds."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class Memory:
    """Reads and writes of sessions, history and traces."""

    def __init__(self, db: Database):
        self.db = db

    async def history_window(self, session_id: str, count_tokens: Callable[[str], int], budget: int) -> list[Message]:
        """The newest whole turns of the session that fit in `budget` tokens, oldest first (no summary)."""
        return (await self.history_view(session_id, count_tokens, budget)).messages

    async def history_view(self, session_id: str, count_tokens: Callable[[str], int], budget: int) -> HistoryView:
        """The session's summary, and the newest whole turns after it that fit in `budget` tokens less the
        summary's own, oldest first."""
        summary = await self.summary(session_id)
        if summary is not None:
            budget -= count_tokens(summary.text)
        kept: list[PastTurn] = []
        for turn in await self.turns_after(session_id, summary.through_turn_id if summary else 0, newest_first=True):
            cost = turn.cost(count_tokens)
            if cost > budget:
                break
            budget -= cost
            kept.insert(0, turn)
        return HistoryView(summary, kept)

    async def turns_after(self, session_id: str, turn_id: int, *, newest_first: bool = False) -> list[PastTurn]:
        """The history's turns after `turn_id` (at most HISTORY_ROWS_SCANNED messages' worth), oldest first unless
        `newest_first`."""
        rows = await self.db.fetchall(
            "SELECT turn_id, role, content FROM messages WHERE session_id = ? AND turn_id > ? "
            "ORDER BY id DESC LIMIT ?", (session_id, turn_id, HISTORY_ROWS_SCANNED))
        turns = [PastTurn(int(messages[0]["turn_id"]), [{"role": m["role"], "content": m["content"]} for m in messages])
                 for messages in _group_by_turn(rows)]
        return turns if newest_first else turns[::-1]

    async def summary(self, session_id: str) -> Summary | None:
        """The session's running summary, or None."""
        row = await self.db.fetchone(
            "SELECT summary, through_turn_id, folded_turns, language, updated_at FROM session_summaries "
            "WHERE session_id = ?", (session_id,))
        return None if row is None else Summary(row[0], int(row[1]), int(row[2]), row[3], row[4])

    async def save_summary(self, session_id: str, summary: Summary, replaces: Summary | None) -> bool:
        """Store `summary` if the session is as it was when it was written: the summary it `replaces` is still the
        current one, and the turns it folds are still in the history (no /reset meanwhile). Whether it was stored."""
        async with self.db.transaction() as conn:
            async with conn.execute("SELECT through_turn_id FROM session_summaries WHERE session_id = ?",
                                    (session_id,)) as cursor:
                current = await cursor.fetchone()
            if (current[0] if current else None) != (replaces.through_turn_id if replaces else None):
                return False
            async with conn.execute("SELECT 1 FROM messages WHERE session_id = ? AND turn_id = ?",
                                    (session_id, summary.through_turn_id)) as cursor:
                if await cursor.fetchone() is None:
                    return False
            await conn.execute(
                "INSERT INTO session_summaries (session_id, summary, through_turn_id, folded_turns, language) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET summary = excluded.summary, "
                "through_turn_id = excluded.through_turn_id, folded_turns = excluded.folded_turns, "
                "language = excluded.language, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
                (session_id, redact(summary.text), summary.through_turn_id, summary.folded_turns, summary.language))
        return True

    async def turn_steps(self, turn_id: int, *, tools_only: bool = False) -> list[Step]:
        """The steps of a turn, in order (only those that ran a tool, with `tools_only`)."""
        kinds = TOOL_KINDS if tools_only else tuple(StepKind)
        rows = await self.db.fetchall(
            "SELECT position, kind, thought, action, action_input, observation, error, duration_ms FROM steps "
            f"WHERE turn_id = ? AND kind IN ({', '.join('?' * len(kinds))}) ORDER BY position", (turn_id, *kinds))
        return [Step(position, StepKind(kind), *rest) for position, kind, *rest in rows]

    async def exported_turns(self, session_id: str, *, with_steps: bool = False) -> list[ExportedTurn]:
        """Every turn of the session's history (since its last /reset), oldest first; with their steps when
        `with_steps`."""
        rows = await self.db.fetchall(
            "SELECT id, question, answer, started_at, duration_ms, user_id FROM turns WHERE id IN "
            "(SELECT DISTINCT turn_id FROM messages WHERE session_id = ?) ORDER BY id", (session_id,))
        return [ExportedTurn(row[0], row[1], row[2], row[3], row[4], row[5],
                             await self.turn_steps(row[0]) if with_steps else []) for row in rows]

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
                    [(session.id, turn_id, "user", redact(record.history_question)),
                     (session.id, turn_id, "assistant", redact(record.result.answer))])
        return turn_id

    async def reset(self, session_id: str) -> int:
        """Forget a session's history and its summary (its traces stay); return how many messages went."""
        async with self.db.transaction() as conn:
            cursor = await conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            await conn.execute("DELETE FROM session_summaries WHERE session_id = ?", (session_id,))
            return cursor.rowcount

    async def last_turn(self, session_id: str) -> StoredTurn | None:
        """The session's most recent turn with its steps, or None."""
        row = await self.db.fetchone(
            "SELECT id, question, answer, status, started_at, duration_ms, input_kind FROM turns "
            "WHERE session_id = ? ORDER BY id DESC LIMIT 1", (session_id,))
        if row is None:
            return None
        steps = await self.db.fetchall(
            "SELECT position, kind, thought, action, action_input, observation, error, duration_ms "
            "FROM steps WHERE turn_id = ? ORDER BY position", (row["id"],))
        turn_id, question, answer, status, started_at, duration_ms, input_kind = row
        return StoredTurn(turn_id, question, answer, TurnStatus(status), started_at, duration_ms,
                          [Step(position, StepKind(kind), *rest) for position, kind, *rest in steps], input_kind)


def _group_by_turn(rows: Sequence[Any]) -> list[list[Message]]:
    """Rows newest first → turns newest first, each turn's messages in order (each with its `turn_id`)."""
    turns: list[list[Message]] = []
    last_turn_id: object = object()
    for turn_id, role, content in rows:
        if turn_id != last_turn_id:
            turns.append([])
            last_turn_id = turn_id
        turns[-1].insert(0, {"role": role, "content": content, "turn_id": turn_id})
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
        "prompt_tokens, completion_tokens, started_at, duration_ms, input_kind) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (session_id, record.user_id, record.source_key, redact(record.question), redact(result.answer), result.status,
         record.mode, result.model_calls, result.prompt_tokens, result.completion_tokens, record.started_at,
         result.duration_ms, record.input_kind))
    return int(cursor.lastrowid)


async def _insert_steps(conn: Any, turn_id: int, steps: Sequence[Step]) -> None:
    await conn.executemany(
        "INSERT INTO steps (turn_id, position, kind, thought, action, action_input, observation, error, duration_ms) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(turn_id, s.position, s.kind, _redacted(s.thought), s.action, _redacted(s.action_input),
          _redacted(s.observation), s.error, s.duration_ms) for s in steps])


def _redacted(text: str | None) -> str | None:
    return None if text is None else redact(text)
