"""The database's errors: the `DatabaseError` branch of the tree drawn in core/errors.py.

    DatabaseError                the database cannot do what was asked
    ├── DatabaseOpenError        the path is a folder, not SQLite, or not writable (also an OSError)
    ├── MigrationError           a migration file failed and was rolled back
    ├── DatabaseBusy             another process held the write lock past the busy timeout (also a
    │                            sqlite3.OperationalError)
    ├── DatabaseInUse            another `qwenbot run` serves the database (db/instance_lock.py)
    ├── DatabaseGone             the file was deleted or replaced while the process had it open
    ├── BackupError              a backup cannot be written, or a file cannot be restored (db/backup.py)
    ├── DatabaseMissing          no database where its marker says one was created (db/marker.py)
    └── SecretKeyError           the key that seals secrets at rest is unusable, or not the one used
"""

from __future__ import annotations

import sqlite3

from core.errors import BotError


class DatabaseError(BotError):
    """The database cannot do what was asked."""


class DatabaseOpenError(DatabaseError, OSError):
    """The file at the database path cannot be used: a folder, not an SQLite file, or not writable."""


class MigrationError(DatabaseError, RuntimeError):
    """A migration file failed; the database is as it was before that file."""


class DatabaseBusy(DatabaseError, sqlite3.OperationalError):
    """Another connection held the lock past the busy timeout; the transaction wrote nothing."""


class DatabaseGone(DatabaseError):
    """The database file was deleted or replaced while open: nothing written from then on would be kept."""


def is_busy(error: sqlite3.Error) -> bool:
    """Whether SQLite gave up waiting for another connection's lock (the busy timeout ran out)."""
    return (getattr(error, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class DatabaseInUse(DatabaseError):
    """Another process holds the database's instance lock, and did not let go within the wait."""


class BackupError(DatabaseError):
    """A backup could not be written, or a file cannot be restored; nothing was replaced."""


class DatabaseMissing(DatabaseError):
    """There is no database file, but its marker shows one existed: it was lost, and is not silently replaced."""


class SecretKeyError(DatabaseError):
    """The key file that seals the database's secrets (db/secret_box.py) cannot be used, or sealed other data."""
