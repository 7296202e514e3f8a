"""Apply the `NNNN_name.sql` files of `migrations/`, in order, each once, each in its own transaction.

A file and its record in `schema_migrations` commit together, so a file that fails half-way leaves nothing
behind and is tried again next time. Files are never edited after they land: a fix is a new file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import aiosqlite

import migrations
from db.errors import MigrationError

# The top-level `migrations/` package: in a clone, and in an installed wheel (package data) alike.
MIGRATIONS_FOLDER = migrations.FOLDER
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    """One SQL file: its name (without `.sql`) and its statements."""

    name: str
    sql: str


def discover(folder: Path = MIGRATIONS_FOLDER) -> list[Migration]:
    """The migration files of `folder`, ordered by number; two files with one number is a mistake."""
    files = sorted(p for p in folder.iterdir() if _NAME.match(p.name))
    numbers = [_NAME.match(p.name).group(1) for p in files]  # type: ignore[union-attr]
    duplicated = {n for n in numbers if numbers.count(n) > 1}
    if duplicated:
        raise MigrationError(f"more than one migration numbered {', '.join(sorted(duplicated))} in {folder}")
    return [Migration(p.stem, p.read_text(encoding="utf-8")) for p in files]


async def applied_names(conn: aiosqlite.Connection) -> set[str]:
    """Names already recorded as applied (creating the record table on first use)."""
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " name TEXT PRIMARY KEY,"
        " applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))"
    )
    async with conn.execute("SELECT name FROM schema_migrations") as cursor:
        return {row[0] async for row in cursor}


async def apply_migrations(conn: aiosqlite.Connection, folder: Path = MIGRATIONS_FOLDER) -> list[str]:
    """Apply pending migrations in order; return the names applied (empty when up to date).

    `conn` must be in autocommit mode (`isolation_level=None`) so the transactions here are the only ones.
    """
    done = await applied_names(conn)
    applied = []
    for migration in discover(folder):
        if migration.name not in done:
            await _apply_one(conn, migration)
            applied.append(migration.name)
    return applied


async def _apply_one(conn: aiosqlite.Connection, migration: Migration) -> None:
    try:
        # executescript runs the file inside the transaction opened by its leading BEGIN.
        await conn.executescript("BEGIN IMMEDIATE;\n" + migration.sql)
        await conn.execute("INSERT INTO schema_migrations (name) VALUES (?)", (migration.name,))
        await conn.execute("COMMIT")
    except Exception as error:
        if conn.in_transaction:
            await conn.execute("ROLLBACK")
        raise MigrationError(f"migration {migration.name} failed and was rolled back: {error}") from error
