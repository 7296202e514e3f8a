"""Whether the database file is still the one the connection writes to.

SQLite keeps writing to an open file after it is deleted, or after another file is moved over its path: the
writes go to a file nobody will open again, and the next start finds the old data, or none (a `/deny` undone).
So the file's identity (device and inode) is taken when it is opened and compared before every commit, and every
few seconds while the bot is idle; a difference stops the bot with one line rather than let it write to a ghost.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from db.errors import DatabaseGone

Identity = tuple[int, int] | None  # (st_dev, st_ino); None: nothing at the path


def identity(path: Path) -> Identity:
    """The device and inode of the file at `path`, or None when there is none."""
    try:
        status = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return status.st_dev, status.st_ino


class FileWatch:
    """The database file as opened, checked against what its path holds now."""

    def __init__(self, path: Path):
        self.path = path
        self.opened: Identity = identity(path)
        self.gone: DatabaseGone | None = None
        self._noticed = asyncio.Event()

    def check(self) -> None:
        """Raise DatabaseGone if the file was deleted or replaced since it was opened (and from then on)."""
        if self.gone is None and self.opened is not None:
            try:
                now = identity(self.path)
            except OSError:  # cannot look (permissions): no evidence that anything changed
                return
            if now != self.opened:
                what = "deleted" if now is None else "replaced by another file"
                self.gone = DatabaseGone(
                    f"the database file {self.path} was {what} while the bot was running; stopped so that "
                    f"nothing more is written to a file that is no longer there (put it back, or start with "
                    f"--new-database to begin a new, empty one)")
                self._noticed.set()
        if self.gone is not None:
            raise self.gone

    async def watch(self, every: float) -> None:
        """Check every `every` seconds, or at once when a commit noticed; raises DatabaseGone."""
        while True:
            self.check()
            try:
                await asyncio.wait_for(self._noticed.wait(), every)
            except TimeoutError:
                pass
