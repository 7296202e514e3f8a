"""Backups of the database while the bot runs, and restores while it does not (`qwenbot backup` / `restore`).

A backup goes through SQLite's online backup API in one step: one read transaction, which in WAL mode never blocks
the bot's writers, copies every page as of its start, WAL included. Copying the file instead can tear it (a
checkpoint writing pages while they are read) and misses whatever still sits in `-wal`. The copy is written beside
its destination, checked (`PRAGMA integrity_check`), switched to a plain rollback journal so that it is one
self-contained file, flushed to disk, and renamed into place: a destination is either the old file or a whole new
backup, never half of one.

A restore replaces the database with a backup only when nothing serves it: it takes the instance lock itself
(db/instance_lock.py), so a bot started meanwhile waits for the restore instead of opening a file about to change.
The backup is copied beside the database and checked first (an SQLite file, intact, holding a qwenbot schema no
newer than this code); the database as it was is kept as `<name>.before-restore`; its `-wal` and `-shm` go, since
SQLite does not tie a WAL to its database file and would replay an old one over the restored pages at the next
open; then the checked copy is renamed over the database in one step.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from db.errors import BackupError, DatabaseInUse
from db.files import make_private_folders
from db.instance_lock import InstanceLock
from db.migrate import MIGRATIONS_FOLDER, discover

SIDE_FILES = ("-wal", "-shm", "-journal")  # what SQLite keeps beside a database file, by suffix of its name
BEFORE_RESTORE = ".before-restore"


@dataclass(frozen=True)
class BackupReport:
    """A database file written by `backup_database` or put in place by `restore_database`."""

    path: Path
    size_bytes: int
    schema: str  # the last migration applied in it
    pending: tuple[str, ...] = ()  # migrations this code has that it lacks (applied at the next open)
    previous: Path | None = None  # restore: where the database as it was is kept


def backup_database(source: Path, destination: str | Path, *, busy_timeout_seconds: float = 10.0) -> BackupReport:
    """Copy the database at `source` to `destination` (a file, or a folder, existing or written with a trailing
    slash, to put a dated file in), safely while other processes write to it; the copy is checked before it takes
    the destination's name."""
    source, folder = Path(source), str(destination).endswith(os.sep)
    destination = Path(destination)
    if not source.is_file():
        raise BackupError(f"no database at {source} to back up")
    if folder or destination.is_dir():
        destination = destination / f"{source.stem}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.sqlite3"
    if _same_file(source, destination):
        raise BackupError(f"the backup {destination} would overwrite the database itself: choose another path")
    make_private_folders(destination.parent)
    part = _beside(destination, ".part")
    try:
        _copy_pages(source, part, busy_timeout_seconds)
        schema = _check(part, MIGRATIONS_FOLDER)
        _replace(part, destination)
    finally:
        _remove(part)
    return BackupReport(destination, destination.stat().st_size, schema.last, schema.pending)


def restore_database(backup: Path, target: Path, *, migrations_folder: Path = MIGRATIONS_FOLDER) -> BackupReport:
    """Put the backup at `backup` in place of the database at `target`, keeping the old one as
    `<target>.before-restore`. Refused (`DatabaseInUse`) while a bot serves `target`, and (`BackupError`) when the
    backup is not an intact qwenbot database this code can run; in both cases nothing is changed."""
    backup, target = Path(backup), Path(target)
    if not backup.is_file():
        raise BackupError(f"no backup at {backup}")
    if _same_file(backup, target):
        raise BackupError(f"{backup} is the database itself, not a backup of it")
    lock = InstanceLock(target)
    if not lock.try_acquire():
        raise DatabaseInUse(f"a qwenbot run (pid {lock.holder()}) is serving the database {target}: stop it, then "
                            f"restore (nothing was changed)")
    incoming = _beside(target, ".restoring")
    try:
        try:
            _copy_pages(backup, incoming, busy_timeout_seconds=0.0)
            schema = _check(incoming, migrations_folder)
        except BackupError as error:
            raise BackupError(f"cannot restore {backup}: {error}; nothing was changed") from error
        previous = _keep_previous(target)
        _remove_side_files(target)
        _replace(incoming, target)
    finally:
        _remove(incoming)
        lock.release()
    return BackupReport(target, target.stat().st_size, schema.last, schema.pending, previous)


# ── copying ─────────────────────────────────────────────────────────────────────────────────────────────────────

def _copy_pages(source: Path, copy: Path, busy_timeout_seconds: float) -> None:
    """Write a consistent copy of the database `source` (its WAL included) to `copy`, as one self-contained,
    private file flushed to disk."""
    _remove(copy)
    make_private_folders(copy.parent)
    os.close(os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # private before any page is in it
    try:
        with closing(sqlite3.connect(source, timeout=busy_timeout_seconds)) as src, \
                closing(sqlite3.connect(copy, isolation_level=None)) as dst:
            src.backup(dst)  # pages=-1: every page in one step, one read transaction, so one moment's state
            # One file that can be moved and copied alone; opening it in the bot switches it back to WAL.
            dst.execute("PRAGMA journal_mode = DELETE")
    except sqlite3.Error as error:
        raise BackupError(f"cannot read {source.name} as an SQLite database: {error}") from error
    _fsync(copy)


def _replace(new: Path, path: Path) -> None:
    """Rename `new` over `path` in one step, and make the rename itself durable."""
    os.replace(new, path)
    _fsync_folder(path.parent)


def _keep_previous(target: Path) -> Path | None:
    """Keep the database as it is now (its WAL's committed pages included) as `<target>.before-restore`."""
    if not target.exists():
        return None
    previous = _beside(target, BEFORE_RESTORE)
    kept = _beside(previous, ".part")
    try:
        _copy_pages(target, kept, busy_timeout_seconds=0.0)
    except BackupError:
        # Not a readable database (maybe why it is being restored): keep its bytes as they are, and its WAL beside
        # the kept copy under the matching name, so that opening the copy still replays what the WAL holds.
        shutil.copyfile(target, kept)
        _fsync(kept)
        if _beside(target, "-wal").exists():
            shutil.copyfile(_beside(target, "-wal"), _beside(previous, "-wal"))
    _replace(kept, previous)
    return previous


def _remove_side_files(target: Path) -> None:
    """Remove the database's `-wal`, `-shm` and `-journal`: they belong to the file being replaced."""
    for suffix in SIDE_FILES:
        _remove(_beside(target, suffix))


# ── checking ────────────────────────────────────────────────────────────────────────────────────────────────────

@dataclass(frozen=True)
class _Schema:
    last: str
    pending: tuple[str, ...]


def _check(path: Path, migrations_folder: Path) -> _Schema:
    """Refuse a copy that is damaged, or not a qwenbot database this code can run; say which migrations it has."""
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            problems = [row[0] for row in conn.execute("PRAGMA integrity_check")]
            if problems != ["ok"]:
                raise BackupError(f"it fails SQLite's integrity check: {_one_line(problems)}")
            if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'schema_migrations'").fetchone():
                raise BackupError("it is an SQLite file, but not a qwenbot database (it has no schema_migrations)")
            applied = {row[0] for row in conn.execute("SELECT name FROM schema_migrations")}
    except sqlite3.Error as error:
        raise BackupError(f"it is not a readable SQLite database: {error}") from error
    known = [migration.name for migration in discover(migrations_folder)]
    newer = sorted(applied - set(known))
    if newer:
        raise BackupError(f"it was made by a newer qwenbot (migration {newer[-1]} is unknown here): upgrade first")
    if not applied:
        raise BackupError("it is a qwenbot database with no migration applied: nothing to restore")
    return _Schema(last=max(applied), pending=tuple(name for name in known if name not in applied))


def _one_line(problems: list[str], limit: int = 200) -> str:
    text = "; ".join(line for problem in problems for line in problem.splitlines() if not line.startswith("***"))
    return text if len(text) <= limit else text[:limit] + "…"


# ── files ───────────────────────────────────────────────────────────────────────────────────────────────────────

def _beside(path: Path, suffix: str) -> Path:
    """The file named as `path` plus `suffix`, in the same folder (so that a rename between them is atomic)."""
    return path.with_name(path.name + suffix)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
