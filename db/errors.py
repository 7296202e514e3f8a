"""The errors a user or the command line may see, all under one root, and the database's own.

The root lives here, at the bottom of the import order (bot → agent → tools → db), so every package can derive
from it; each package's `errors.py` holds its own branch. `qwenbot` turns any `BotError` into one line on stderr,
and the Telegram handlers turn the ones a turn can meet into a short apology.

    BotError                         (db/errors.py)
    ├── ConfigError                  a setting the bot cannot use; names the variable (bot/config.py)
    ├── EvalFileError                a question file `qwenbot eval` cannot read; names the line (bot/evaluation.py)
    ├── DatabaseError                the database cannot do what was asked (here)
    │   ├── DatabaseOpenError        the path is a folder, not SQLite, or not writable (also an OSError)
    │   ├── MigrationError           a migration file failed and was rolled back
    │   ├── DatabaseBusy             another process held the write lock past the busy timeout
    │   │                            (also a sqlite3.OperationalError)
    │   ├── DatabaseInUse            another `qwenbot run` serves the database (db/instance_lock.py)
    │   ├── DatabaseGone             the file was deleted or replaced while the process had it open
    │   └── DatabaseMissing          no database where its marker says one was created (db/marker.py)
    ├── ToolError                    a tool refuses its input; the model reads it (tools/errors.py)
    │   ├── UnknownTool              no tool of that name (also a KeyError)
    │   ├── CalculationError
    │   ├── CourseError
    │   └── McpToolError             an MCP tool answered with an error, or its server refused the call
    │       └── ServerUnavailable    the MCP server cannot be reached or hung up
    ├── ConfirmationNeeded           enabling a tool that may change data needs the admin's flag (tools/errors.py)
    ├── McpConfigError               an MCP server definition cannot be used (tools/errors.py)
    └── AgentError                   (agent/errors.py)
        └── LLMError                 a backend could not produce a completion
            ├── ModelLoadError
            ├── LLMTimeout
            ├── LLMCancelled
            └── LLMOutOfMemory
"""

from __future__ import annotations

import sqlite3


class BotError(Exception):
    """Base of every error a user or the command line may see."""


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


class DatabaseMissing(DatabaseError):
    """There is no database file, but its marker shows one existed: it was lost, and is not silently replaced."""
