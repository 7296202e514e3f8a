"""One serving process per database: an exclusive `flock` on a lock file beside it (`bot.sqlite3.lock`).

Two `qwenbot run` on one database would both poll Telegram and both replay the journal's unhandled updates, so
every answer could go out twice. The second process waits for the lock (a rolling restart: the old process
finishes its turns, stops and lets go) or gives up after its wait with `DatabaseInUse`.

`flock` belongs to the open file, so the kernel releases it when the process ends, however it ends (SIGKILL
included): a lock file left behind by a crash is never stale. The file is never deleted, as deleting it would let
two processes lock two different files of one name; it holds the pid of the process holding it, for the message.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
from pathlib import Path

from db.errors import DatabaseInUse, DatabaseOpenError
from db.files import make_private_folders

log = logging.getLogger(__name__)

RETRY_SECONDS = 0.2  # how often a waiting process tries the lock again


def lock_path(database_path: Path) -> Path:
    """The lock file of a database: beside it, named after it."""
    return database_path.with_name(database_path.name + ".lock")


class InstanceLock:
    """The exclusive lock of one database's serving process."""

    def __init__(self, database_path: Path):
        self.database_path = Path(database_path)
        self.path = lock_path(self.database_path)
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        """Take the lock if it is free (without waiting); write our pid into the file."""
        try:
            make_private_folders(self.path.parent)  # the database's folder, when the lock comes first
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as error:
            raise DatabaseOpenError(f"cannot open the database {self.database_path}: cannot create "
                                    f"{error.filename or self.path}: {error.strerror or error}") from error
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> str:
        """The pid written by the process holding the lock ('?' when unreadable)."""
        try:
            return self.path.read_text(encoding="ascii").strip() or "?"
        except (OSError, UnicodeDecodeError):
            return "?"

    def release(self) -> None:
        """Let the lock go (idempotent)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    async def acquire(self, wait_seconds: float, stop: asyncio.Event | None = None) -> bool:
        """Take the lock, waiting up to `wait_seconds` for the process holding it to stop.

        Returns False when `stop` is set while waiting; raises `DatabaseInUse` when the wait runs out.
        """
        if self.try_acquire():
            return True
        log.info("another process (pid %s) serves %s; waiting up to %g s for it to stop", self.holder(),
                 self.database_path, wait_seconds)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        while loop.time() < deadline:
            if stop is not None and stop.is_set():
                return False
            await asyncio.sleep(min(RETRY_SECONDS, max(0.0, deadline - loop.time())))
            if self.try_acquire():
                log.info("the other process stopped; serving %s now", self.database_path)
                return True
        raise DatabaseInUse(f"another qwenbot run (pid {self.holder()}) is serving the database "
                            f"{self.database_path}; waited {wait_seconds:g} s for it to stop")


def serving_pid(database_path: Path) -> str | None:
    """The pid of the process serving the database now (as its lock file says), or None when none does.

    Changes nothing: the lock file, when there is one, is opened read-only and its lock tried and let go at once.
    """
    path = lock_path(Path(database_path))
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return InstanceLock(database_path).holder()
    finally:
        os.close(fd)  # closing lets a lock taken here go
    return None
