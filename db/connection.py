"""The bot's one SQLite file: opened in WAL mode with foreign keys on, migrated on open.

One aiosqlite connection is shared by the whole process. Writes go through `transaction()`, which holds a
lock so that two coroutines never interleave statements inside one transaction. `transaction(urgent=True)` goes
before the ordinary writers waiting for it: the update journal, which every answer waits on, does not queue behind
the dozens of turns a burst of questions finishes at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Iterable

import aiosqlite

from db.errors import DatabaseBusy, DatabaseOpenError, is_busy
from db.file_watch import FileWatch
from db.files import create_private
from db.marker import mark_created, refuse_if_lost
from db.migrate import MIGRATIONS_FOLDER, apply_migrations
from db.write_lock import WriteLock

# How long a write waits for another process's lock before DatabaseBusy (the default of
# DATABASE_BUSY_TIMEOUT_SECONDS).
BUSY_TIMEOUT_SECONDS = 10.0
# What the write-ahead log is cut back to after a checkpoint: SQLite reuses the file but never shrinks it, so one
# burst (twenty 1 MB updates) would leave it that large for good. 4 MiB is about one automatic checkpoint's worth.
WAL_SIZE_LIMIT_BYTES = 4 * 1024 * 1024


class Database:
    """A migrated SQLite database: reads at any time, writes inside `transaction()`."""

    def __init__(self, conn: aiosqlite.Connection, path: Path):
        self.conn = conn
        self.path = path
        self.applied: list[str] = []
        self.file = FileWatch(path)
        self.closed = False  # set by `close`: what is still running at shutdown can tell why a write failed
        self._write_lock = WriteLock()

    @asynccontextmanager
    async def transaction(self, *, urgent: bool = False) -> AsyncIterator[aiosqlite.Connection]:
        """Run the block's statements as one transaction: all of them commit, or none (`urgent`: go first)."""
        async with self._write_lock.hold(urgent):
            try:
                # IMMEDIATE takes the write lock now, so a busy database makes us wait here (busy_timeout),
                # not fail half-way through the block.
                await self._execute_or_busy("BEGIN IMMEDIATE")
                yield self.conn
                self.file.check()  # a commit to a deleted file would be lost: roll back and say so instead
                await self._execute_or_busy("COMMIT")
            except BaseException:
                await self._roll_back()
                raise

    async def _roll_back(self) -> None:
        """End the transaction, whatever state the connection is in.

        A statement whose await was cancelled (shutdown cancels the turns still writing) still runs on aiosqlite's
        thread, in order: its BEGIN may still be queued, so `in_transaction` cannot tell. A ROLLBACK queued after it
        always ends it, before the next writer's BEGIN; with no transaction left it fails, harmlessly.
        """
        try:
            await self.conn.execute("ROLLBACK")
        except (sqlite3.OperationalError, ValueError):
            pass  # no transaction was active (it never began, or it committed), or the connection is closed

    async def _execute_or_busy(self, sql: str) -> None:
        """Run `sql`; another process's lock held past the busy timeout becomes a `DatabaseBusy`."""
        try:
            await self.conn.execute(sql)
        except sqlite3.OperationalError as error:
            if not is_busy(error):
                raise
            raise DatabaseBusy(str(error)) from error

    async def checkpoint(self, attempts: int = 5) -> bool:
        """Copy the write-ahead log into the database file and empty the log, between writers (the log keeps the
        pages a secret was written to until it is reused; after a secret is scrubbed from a row, it must go).
        Best effort: a read still open on the shared connection makes SQLite refuse, so it is tried `attempts`
        times; whether it was done."""
        for attempt in range(attempts):
            async with self._write_lock.hold(False):
                try:
                    async with self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)") as cursor:
                        busy, _, _ = await cursor.fetchone()
                except sqlite3.OperationalError as error:
                    if not is_busy(error):
                        raise
                    busy = 1
            if not busy:
                return True
            await asyncio.sleep(0.05 * (attempt + 1))
        return False

    async def fetchall(self, sql: str, params: Iterable[Any] = ()) -> list[aiosqlite.Row]:
        """All rows of a query."""
        async with self.conn.execute(sql, tuple(params)) as cursor:
            return list(await cursor.fetchall())

    async def fetchone(self, sql: str, params: Iterable[Any] = ()) -> aiosqlite.Row | None:
        """The first row of a query, or None."""
        async with self.conn.execute(sql, tuple(params)) as cursor:
            return await cursor.fetchone()

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        self.closed = True
        await self.conn.close()


async def open_database(path: str | Path, *, busy_timeout_seconds: float = BUSY_TIMEOUT_SECONDS,
                        migrations_folder: Path = MIGRATIONS_FOLDER, new_database: bool = False) -> Database:
    """Open (creating folders as needed) and migrate the database at `path`.

    A database that once existed there and is gone (db/marker.py) is not made anew unless `new_database`: that
    raises `DatabaseMissing`.
    """
    path = Path(path)
    on_disk = str(path) != ":memory:"
    if on_disk:
        if not new_database:
            await asyncio.to_thread(refuse_if_lost, path)
        await asyncio.to_thread(create_private, path)
    # Probe with plain sqlite3 first: when aiosqlite.connect itself fails, its worker thread can outlive the
    # event loop and print a traceback of its own.
    try:
        await asyncio.to_thread(_probe, path)
    except sqlite3.Error as error:
        raise DatabaseOpenError(f"cannot open the database {path}: {error}") from error
    # `timeout` is sqlite3's busy timeout: how long a statement waits for another process's lock.
    conn = await aiosqlite.connect(path, isolation_level=None, timeout=busy_timeout_seconds)
    conn.row_factory = aiosqlite.Row
    try:
        await _configure(conn, path)
        database = Database(conn, path)
        database.applied = await apply_migrations(conn, migrations_folder)
    except BaseException:
        await conn.close()
        raise
    if on_disk:
        with contextlib.suppress(OSError):  # a folder that takes no new file: the database works all the same
            await asyncio.to_thread(mark_created, path)
    return database


async def _configure(conn: aiosqlite.Connection, path: Path) -> None:
    # The first statements are where a folder, or a file that is not SQLite, shows itself: a user's mistake.
    try:
        await conn.execute("PRAGMA journal_mode = WAL")
        await conn.execute("PRAGMA foreign_keys = ON")
        # Deleted and overwritten content is zeroed, not left in free pages: a secret scrubbed from a row (the
        # journal's husks, sealed MCP headers) is then gone from the file, not merely unlinked.
        await conn.execute("PRAGMA secure_delete = ON")
        await conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT_BYTES}")
    except sqlite3.Error as error:
        raise DatabaseOpenError(f"cannot open the database {path}: {error}") from error


def _probe(path: Path) -> None:
    sqlite3.connect(path).close()
