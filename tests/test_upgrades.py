"""Upgrades from every past schema: a database built at each version (migrations 0001..k applied, with data in every
table that exists at that version) is migrated to the latest, and nothing it held is lost.

Each migration has its fixture rows in `FIXTURES`, inserted right after that migration is applied, as a bot of that
version would have written them. A new migration needs only its own entry: rows for the tables it creates or
changes (or `Nothing("why")` for one that adds no place for data). When a migration moves data, the rows it moves
say where they end up (`Row(..., latest_table=..., latest_values=...)`).
"""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from db import apply_migrations, open_database
from db.migrate import MIGRATIONS_FOLDER, Migration, discover

SHIPPED = discover(MIGRATIONS_FOLDER)


@dataclass(frozen=True)
class Row:
    """One row a bot of some version wrote, and where it must be found at the latest schema."""

    table: str
    values: dict[str, Any]
    latest_table: str | None = None  # default: the same table
    latest_values: dict[str, Any] | None = None  # default: the same values (columns may have been added)

    def expected(self) -> tuple[str, dict[str, Any]]:
        return self.latest_table or self.table, self.latest_values or self.values


@dataclass(frozen=True)
class Nothing:
    """A migration that adds no table or column to hold data (an index, a fix to a default…), and why."""

    why: str
    rows: list[Row] = field(default_factory=list)


def rows(*items: Row) -> list[Row]:
    return list(items)


SESSION = {"id": "tg:1001", "chat_id": 1001, "kind": "private", "title": "Alice"}
GROUP = {"id": "tg:-1001000000001:7", "chat_id": -1001000000001, "kind": "supergroup", "title": "Team"}
TURN_1 = {"id": 1, "session_id": "tg:1001", "user_id": 1001, "source_key": "update:41", "question": "大模型实战有多少节？",
          "answer": "200 节。", "status": "answered", "model_calls": 2, "prompt_tokens": 900, "completion_tokens": 60,
          "started_at": "2025-05-01T10:00:00.000Z", "duration_ms": 5400}
FIXTURES: dict[str, list[Row] | Nothing] = {
    "0001_chats_and_messages": rows(
        Row("sessions", SESSION),
        Row("sessions", GROUP),
        Row("messages", {"id": 1, "session_id": "tg:1001", "role": "user", "content": "大模型实战有多少节？"}),
        Row("messages", {"id": 2, "session_id": "tg:1001", "role": "assistant", "content": "200 节。"}),
        Row("messages", {"id": 3, "session_id": GROUP["id"], "role": "user", "content": "hello team"}),
    ),
    "0002_turn_traces": rows(
        Row("turns", TURN_1, latest_values={**TURN_1, "input_kind": "text"}),  # typed, before input_kind (0016)
        Row("steps", {"turn_id": 1, "position": 0, "kind": "tool", "thought": "查一下", "action": "course_query",
                      "action_input": '{"course_name": "大模型实战"}', "observation": '{"lessons": 200}',
                      "duration_ms": 12}),
        Row("steps", {"turn_id": 1, "position": 1, "kind": "final", "thought": "I now know the final answer"}),
    ),
    "0003_courses": rows(
        Row("courses", {"name": "团队自建课程", "lessons": 12, "updates_per_week": 2, "hours_per_update": 1.5}),
    ),
    "0004_tool_settings": rows(
        Row("tool_settings", {"scope": "global", "tool_name": "calculator", "enabled": 0}),
        Row("tool_settings", {"scope": "tg:1001", "tool_name": "course_list", "enabled": 1}),
    ),
    "0005_audit_log": rows(
        Row("audit_log", {"user_id": 42, "chat_id": 42, "action": "tool_off", "detail": "calculator global"}),
    ),
    "0006_access_lists": rows(
        Row("access_list", {"kind": "user", "subject_id": 3003, "allowed": 1, "changed_by": 42}),
        Row("access_list", {"kind": "chat", "subject_id": -1001000000002, "allowed": 0, "changed_by": 42}),
    ),
    "0007_telegram_updates": rows(
        Row("telegram_updates", {"update_id": 41, "payload": '{"update_id": 41}',
                                 "handled_at": "2025-05-01T10:00:06.000Z"}),
        # Unhandled when the old version stopped: the next start must still find it to handle it.
        Row("telegram_updates", {"update_id": 42, "payload": '{"update_id": 42}'},
            latest_values={"update_id": 42, "payload": '{"update_id": 42}', "handled_at": None}),
    ),
    "0008_mcp_servers": rows(
        Row("mcp_servers", {"name": "files", "transport": "http", "url": "https://mcp.example.org/mcp",
                            "headers": "{}", "added_by": 42}),
        Row("mcp_tools", {"server": "files", "name": "read", "title": "Read a file", "description": "reads",
                          "input_schema": '{"type": "object"}', "read_only": 1, "destructive": 0}),
    ),
    "0009_update_journal_source": rows(
        Row("telegram_updates", {"source": "777000@https://api.telegram.org/bot", "update_id": 43,
                                 "payload": '{"update_id": 43}'}),
    ),
    "0010_progress_messages": rows(
        Row("progress_messages", {"chat_id": 1001, "message_id": 77}),
    ),
    "0011_chat_options": rows(
        Row("chat_options", {"scope": "global", "name": "require_tool_call", "value": "on"}),
        Row("chat_options", {"scope": "tg:1001", "name": "require_tool_call", "value": "off"}),
    ),
    "0012_documents": rows(
        Row("documents", {"id": 1, "name": "team-guide.md", "title": "Team guide", "kind": "md", "size_bytes": 120,
                          "text_bytes": 110, "sha256": "ab" * 32, "chunk_count": 1, "scope": "global",
                          "added_by": 42, "added_by_name": "Ada", "added_in": 42}),
        Row("document_chunks", {"id": 1, "document_id": 1, "position": 0, "heading": "Team guide › Setup",
                                "body": "Run scripts/run.sh once; 大模型技术实战 has 200 lessons."}),
        Row("document_index", {"rowid": 1, "heading": "Team guide › Setup",
                               "body": "Run scripts/run.sh once; 大模型 模型技 型技术 has 200 lessons."}),
        Row("document_chunk_vectors", {"chunk_id": 1, "model": "text-embedding-3-small", "dims": 2,
                                       "vector": b"\x00\x00\x80\x3f\x00\x00\x00\x40"}),
    ),
    "0013_sealed_mcp_secrets": rows(
        Row("mcp_servers", {"name": "wiki", "transport": "http", "url": "https://wiki.example.org/mcp",
                            "headers": '{"Authorization": ""}', "added_by": 42, "sealed": "gAAAAAB-sealed-by-fernet"}),
    ),
    "0014_deliveries_and_update_epochs": rows(
        Row("answer_deliveries", {"source_key": "update:41", "piece": 0, "chat_id": 1001, "message_id": 78}),
        Row("update_epochs", {"base": "777000@https://api.telegram.org/bot", "epoch": 2, "high_water": 43}),
    ),
    "0015_health_checks": rows(
        Row("health_checks", {"id": 1, "checked_at": "2025-05-01T10:00:30.000Z"}),
    ),
    "0016_turn_input_kind": rows(
        Row("turns", {"id": 2, "session_id": "tg:1001", "user_id": 1001, "source_key": "update:52",
                      "question": "How many lessons does the machine learning course have?", "answer": "200.",
                      "status": "answered", "model_calls": 1, "prompt_tokens": 700, "completion_tokens": 20,
                      "started_at": "2025-05-01T10:01:00.000Z", "duration_ms": 4100, "input_kind": "voice"}),
    ),
    "0017_conversations": rows(
        Row("session_summaries", {"session_id": "tg:1001", "summary": "Alice asked how many lessons 大模型实战 has: 200.",
                                  "through_turn_id": 1, "folded_turns": 1, "language": "zh",
                                  "updated_at": "2025-05-01T10:02:00.000Z"}),
        Row("user_quotas", {"user_id": 1001, "kind": "turns", "daily_limit": 50, "set_by": 42,
                            "updated_at": "2025-05-01T10:03:00.000Z"}),
        Row("chat_options", {"scope": "tg:1001", "name": "persona", "value": "You are Ada, a patient tutor."}),
    ),
}


def fixture_rows(migration: str) -> list[Row]:
    entry = FIXTURES.get(migration)
    if entry is None:
        pytest.fail(f"migration {migration} has no fixture rows: add an entry to FIXTURES in {Path(__file__).name} "
                    f"with rows for the tables it creates or changes (or Nothing('why') if it holds no data), so "
                    f"that upgrading a database of that version is tested with data in it")
    return entry.rows if isinstance(entry, Nothing) else entry


def user_tables(conn: sqlite3.Connection) -> set[str]:
    """The tables that hold the bot's data (not the migration record, SQLite's own, or a virtual table's shadows)."""
    found = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall())
    virtual = [name for name, sql in found.items() if (sql or "").upper().startswith("CREATE VIRTUAL TABLE")]
    return {name for name in found if name != "schema_migrations" and not name.startswith("sqlite_")
            and not any(name.startswith(f"{table}_") for table in virtual)}


def count_matching(conn: sqlite3.Connection, table: str, values: dict[str, Any]) -> int:
    where = " AND ".join(f"{column} IS ?" for column in values)
    return conn.execute(f"SELECT count(*) FROM {table} WHERE {where}", tuple(values.values())).fetchone()[0]


async def build_at_version(path: Path, migrations: list[Migration], folder: Path) -> dict[str, int]:
    """A database with `migrations` applied, each one's fixture rows written right after it; returns the rows per
    table it holds."""
    folder.mkdir()
    conn = await aiosqlite.connect(path, isolation_level=None)
    try:
        await conn.execute("PRAGMA journal_mode = WAL")
        await conn.execute("PRAGMA foreign_keys = ON")
        for migration in migrations:
            (folder / f"{migration.name}.sql").write_text(migration.sql, encoding="utf-8")
            assert await apply_migrations(conn, folder) == [migration.name]
            for row in fixture_rows(migration.name):
                columns = ", ".join(row.values)
                marks = ", ".join("?" for _ in row.values)
                await conn.execute(f"INSERT INTO {row.table} ({columns}) VALUES ({marks})", tuple(row.values.values()))
    finally:
        await conn.close()
    with closing(sqlite3.connect(path)) as plain:
        return {table: plain.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in user_tables(plain)}


def test_every_migration_has_fixture_rows():
    for migration in SHIPPED:
        fixture_rows(migration.name)
    assert set(FIXTURES) <= {m.name for m in SHIPPED}, "fixtures for migrations that do not exist"


@pytest.mark.parametrize("version", range(1, len(SHIPPED) + 1), ids=[m.name for m in SHIPPED])
async def test_a_database_of_every_version_upgrades_to_the_latest_and_loses_nothing(tmp_path, version):
    await upgrade_and_check(tmp_path, version, SHIPPED, MIGRATIONS_FOLDER)


async def upgrade_and_check(tmp_path: Path, version: int, shipped: list[Migration], latest: Path) -> None:
    """Build a database at `version` of `shipped`, open it with the migrations in `latest`, and check that every
    fixture row is still where it belongs and no table holds fewer rows."""
    path = tmp_path / "bot.sqlite3"
    held = await build_at_version(path, shipped[:version], tmp_path / "migrations")
    empty = sorted(table for table, count in held.items() if count == 0)
    assert not empty, (f"at {shipped[version - 1].name} these tables hold no fixture rows: {empty}; add rows for "
                       f"them to FIXTURES in {Path(__file__).name}, under the migration that creates them")

    db = await open_database(path, migrations_folder=latest)  # what the next start of the latest version does
    await db.close()
    assert db.applied == [m.name for m in shipped[version:]]

    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        for migration in shipped[:version]:
            for row in fixture_rows(migration.name):
                table, values = row.expected()
                assert count_matching(conn, table, values) == 1, (
                    f"{table} lost {values} (written at {migration.name}) when upgraded from "
                    f"{shipped[version - 1].name}")
        now = {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in user_tables(conn)}
    shrunk = {table: (count, now.get(table)) for table, count in held.items() if now.get(table, 0) < count}
    assert not shrunk, f"tables with fewer rows after the upgrade (before, after): {shrunk}"


def test_a_migration_without_fixture_rows_fails_with_a_message_saying_to_add_them():
    """The guard the tests above rely on: a new file without fixtures is caught, not skipped."""
    with pytest.raises(pytest.fail.Exception) as failed:
        fixture_rows("9999_new_table")
    assert "migration 9999_new_table has no fixture rows: add an entry to FIXTURES" in str(failed.value)


async def test_a_migration_that_loses_data_fails_the_upgrade_test(tmp_path, monkeypatch):
    """The check can fail: a later migration that deletes a row written at an older version is caught."""
    losing = Migration("9999_lose_a_course", "DELETE FROM courses WHERE name = '团队自建课程';")
    latest = tmp_path / "latest"
    latest.mkdir()
    for migration in [*SHIPPED, losing]:
        (latest / f"{migration.name}.sql").write_text(migration.sql, encoding="utf-8")
    monkeypatch.setitem(FIXTURES, losing.name, Nothing("deletes, adds nothing"))
    with pytest.raises(AssertionError, match=r"courses lost .*团队自建课程.* \(written at 0003_courses\)"):
        await upgrade_and_check(tmp_path, len(SHIPPED), [*SHIPPED, losing], latest)
