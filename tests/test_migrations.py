"""Migrations and the database: order, idempotence, rollback of a failing file, WAL, foreign keys, transactions."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import aiosqlite
import pytest

from db import DatabaseOpenError, MigrationError, apply_migrations, open_database
from db.migrate import MIGRATIONS_FOLDER, discover

FOUNDATION = [
    "0001_chats_and_messages", "0002_turn_traces", "0003_courses", "0004_tool_settings", "0005_audit_log",
    "0006_access_lists",
]
# Later work adds files after these; every test below must hold for whatever the folder holds.
SHIPPED = [m.name for m in discover(MIGRATIONS_FOLDER)]


def read(path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """Rows of a query, read with a separate plain sqlite3 connection (what any other reader would see)."""
    with sqlite3.connect(path) as conn:
        return conn.execute(sql, params).fetchall()


def tables(path: Path) -> set[str]:
    return {name for (name,) in read(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}


def write(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir(exist_ok=True)
    for name, sql in files.items():
        (folder / name).write_text(sql, encoding="utf-8")
    return folder


async def test_shipped_migrations_apply_in_order_and_are_recorded(db, db_path):
    assert db.applied == SHIPPED and db.applied[:len(FOUNDATION)] == FOUNDATION
    assert [name for name, in read(db_path, "SELECT name FROM schema_migrations ORDER BY rowid")] == SHIPPED
    assert {"sessions", "messages", "turns", "steps", "courses", "tool_settings", "audit_log",
            "access_list"} <= tables(db_path)


async def test_reopening_applies_nothing(db, db_path):
    await db.close()
    again = await open_database(db_path)
    try:
        assert again.applied == []
        assert read(db_path, "SELECT count(*) FROM schema_migrations") == [(len(SHIPPED),)]
        assert read(db_path, "SELECT count(*) FROM courses") == [(4,)]  # the seed was not inserted twice
    finally:
        await again.close()


async def test_seed_courses(db):
    rows = await db.fetchall("SELECT name, lessons, updates_per_week, hours_per_update FROM courses ORDER BY id")
    assert [tuple(row) for row in rows] == [
        ("大模型技术实战", 200, 3, 2.0), ("机器学习实战", 230, 2, 1.5), ("深度学习实战", 150, 1, 3.0),
        ("AI数据分析", 10, 1, 1.0),
    ]


async def test_wal_mode_and_foreign_keys_are_on(db, db_path):
    assert (await db.fetchone("PRAGMA journal_mode"))[0] == "wal"
    assert (await db.fetchone("PRAGMA foreign_keys"))[0] == 1
    assert read(db_path, "PRAGMA journal_mode") == [("wal",)]  # WAL is a property of the file itself
    with pytest.raises(sqlite3.IntegrityError):
        async with db.transaction() as conn:
            await conn.execute("INSERT INTO messages (session_id, role, content) VALUES ('nobody', 'user', 'hi')")


async def test_deleting_a_session_cascades_to_its_messages(db):
    async with db.transaction() as conn:
        await conn.execute("INSERT INTO sessions (id) VALUES ('tg:1')")
        await conn.execute("INSERT INTO messages (session_id, role, content) VALUES ('tg:1', 'user', 'hi')")
    async with db.transaction() as conn:
        await conn.execute("DELETE FROM sessions WHERE id = 'tg:1'")
    assert (await db.fetchone("SELECT count(*) FROM messages"))[0] == 0


async def test_a_transaction_commits_all_or_nothing(db, db_path):
    async with db.transaction() as conn:
        await conn.execute("INSERT INTO sessions (id) VALUES ('a')")
        await conn.execute("INSERT INTO sessions (id) VALUES ('b')")
    with pytest.raises(RuntimeError):
        async with db.transaction() as conn:
            await conn.execute("INSERT INTO sessions (id) VALUES ('c')")
            raise RuntimeError("our own bug, half-way through")
    assert read(db_path, "SELECT id FROM sessions ORDER BY id") == [("a",), ("b",)]
    async with db.transaction() as conn:  # the connection is usable again after the rollback
        await conn.execute("INSERT INTO sessions (id) VALUES ('d')")
    assert read(db_path, "SELECT id FROM sessions ORDER BY id") == [("a",), ("b",), ("d",)]


async def test_fetchone_returns_none_when_nothing_matches(db):
    assert await db.fetchone("SELECT name FROM courses WHERE name = ?", ("没有这门课",)) is None


async def test_files_apply_in_numeric_order(tmp_path):
    folder = write(tmp_path / "m", {
        "0010_third.sql": "INSERT INTO log VALUES ('third');",
        "0002_second.sql": "INSERT INTO log VALUES ('second');",
        "0001_first.sql": "CREATE TABLE log (what TEXT); INSERT INTO log VALUES ('first');",
        "README.md": "not a migration",
        "notes.sql": "this is not SQL and not a migration name",
    })
    path = tmp_path / "t.sqlite3"
    db = await open_database(path, migrations_folder=folder)
    await db.close()
    assert db.applied == ["0001_first", "0002_second", "0010_third"]
    assert read(path, "SELECT what FROM log ORDER BY rowid") == [("first",), ("second",), ("third",)]
    assert read(path, "SELECT name FROM schema_migrations ORDER BY rowid") == [
        ("0001_first",), ("0002_second",), ("0010_third",)]


async def test_a_new_file_is_applied_alone(tmp_path):
    folder = write(tmp_path / "m", {"0001_first.sql": "CREATE TABLE log (what TEXT);"})
    path = tmp_path / "t.sqlite3"
    await (await open_database(path, migrations_folder=folder)).close()
    write(folder, {"0002_more.sql": "INSERT INTO log VALUES ('x');"})
    db = await open_database(path, migrations_folder=folder)
    await db.close()
    assert db.applied == ["0002_more"]
    assert read(path, "SELECT what FROM log") == [("x",)]


async def test_a_failing_migration_leaves_nothing_behind_and_is_retried_once_fixed(tmp_path):
    folder = write(tmp_path / "m", {
        "0001_good.sql": "CREATE TABLE good (x INTEGER);",
        "0002_bad.sql": ("CREATE TABLE half (x INTEGER);\n"
                         "INSERT INTO good VALUES (1);\n"
                         "INSERT INTO missing_table VALUES (1);\n"),
    })
    path = tmp_path / "t.sqlite3"
    with pytest.raises(MigrationError, match="0002_bad") as caught:
        await open_database(path, migrations_folder=folder)
    assert "missing_table" in str(caught.value)
    assert "half" not in tables(path)
    assert read(path, "SELECT count(*) FROM good") == [(0,)]
    assert read(path, "SELECT name FROM schema_migrations") == [("0001_good",)]

    write(folder, {"0002_bad.sql": "CREATE TABLE half (x INTEGER);\nINSERT INTO good VALUES (1);\n"})
    db = await open_database(path, migrations_folder=folder)
    await db.close()
    assert db.applied == ["0002_bad"]
    assert "half" in tables(path)
    assert read(path, "SELECT x FROM good") == [(1,)]
    assert read(path, "SELECT name FROM schema_migrations ORDER BY rowid") == [("0001_good",), ("0002_bad",)]


async def test_a_failing_migration_stops_the_ones_after_it(tmp_path):
    folder = write(tmp_path / "m", {
        "0001_bad.sql": "CREATE TABLE one (x); SELECT * FROM nowhere;",
        "0002_next.sql": "CREATE TABLE two (x);",
    })
    path = tmp_path / "t.sqlite3"
    with pytest.raises(MigrationError):
        await open_database(path, migrations_folder=folder)
    assert {"one", "two"} & tables(path) == set()
    assert read(path, "SELECT count(*) FROM schema_migrations") == [(0,)]


def test_two_files_with_one_number_are_refused(tmp_path):
    folder = write(tmp_path / "m", {"0001_a.sql": "CREATE TABLE a (x);", "0001_b.sql": "CREATE TABLE b (x);"})
    with pytest.raises(MigrationError, match="0001"):
        discover(folder)


async def test_two_files_with_one_number_apply_nothing(tmp_path):
    folder = write(tmp_path / "m", {"0001_a.sql": "CREATE TABLE a (x);", "0001_b.sql": "CREATE TABLE b (x);"})
    path = tmp_path / "t.sqlite3"
    with pytest.raises(MigrationError):
        await open_database(path, migrations_folder=folder)
    assert {"a", "b"} & tables(path) == set()


def test_shipped_files_are_numbered_without_gaps():
    assert SHIPPED[:len(FOUNDATION)] == FOUNDATION
    numbers = [int(name[:4]) for name in SHIPPED]
    assert numbers == list(range(1, numbers[-1] + 1))


def test_every_sql_file_of_the_folder_is_a_migration():
    # A file the runner's name pattern skips (capitals, a dash) would silently never be applied.
    assert sorted(p.stem for p in MIGRATIONS_FOLDER.glob("*.sql")) == SHIPPED


async def test_open_creates_missing_folders(tmp_path):
    path = tmp_path / "deep" / "er" / "bot.sqlite3"
    db = await open_database(path)
    await db.close()
    assert path.is_file()


async def test_a_folder_or_a_non_sqlite_file_is_refused_in_words(tmp_path):
    with pytest.raises(DatabaseOpenError, match="cannot open the database"):
        await open_database(tmp_path)
    junk = tmp_path / "notes.txt"
    junk.write_text("definitely not a database " * 100)
    with pytest.raises(DatabaseOpenError, match="not a database"):
        await open_database(junk)
    assert junk.read_text().startswith("definitely not")  # the file was not overwritten


async def test_after_a_failure_the_same_connection_is_clean_and_usable(tmp_path):
    folder = write(tmp_path / "m", {
        "0001_good.sql": "CREATE TABLE good (x INTEGER);",
        "0002_bad.sql": "CREATE TABLE half (x INTEGER); INSERT INTO good VALUES (1); INSERT INTO nowhere VALUES (1);",
    })
    conn = await aiosqlite.connect(tmp_path / "t.sqlite3", isolation_level=None)
    try:
        with pytest.raises(MigrationError):
            await apply_migrations(conn, folder)
        assert not conn.in_transaction
        async with conn.execute("SELECT name FROM sqlite_master WHERE name = 'half'") as cursor:
            assert await cursor.fetchall() == []
        async with conn.execute("SELECT count(*) FROM good") as cursor:
            assert await cursor.fetchone() == (0,)
        write(folder, {"0002_bad.sql": "CREATE TABLE half (x INTEGER);"})
        assert await apply_migrations(conn, folder) == ["0002_bad"]
        assert await apply_migrations(conn, folder) == []
    finally:
        await conn.close()
