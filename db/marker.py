"""Whether a database once existed at a path: a marker file beside it, so that a lost database is not silently
replaced by an empty one.

SQLite creates a missing database file on open. After the file was deleted (by mistake, by a cleanup script, by a
restore gone wrong) that used to mean a fresh, empty database at the next start: every `/deny` undone, every admin
edit and every history gone, and nothing said. So the first open of a database writes `<name>.created` beside it
(holding when), and an open that finds the marker but no database refuses with `DatabaseMissing`, unless the
caller asks for a new database on purpose (`qwenbot run --new-database`, `qwenbot migrate --new-database`).

Why a marker of its own, and not what else lies in the folder: the instance lock file (db/instance_lock.py) is
made before the database is opened, so it exists after a first start that failed; `-wal`/`-shm` files go with a
clean close; converted models have nothing to do with the database. The marker is written only once a database
was really opened and migrated, and an existing database without one (from before the marker) gets one then. A
data folder deleted as a whole takes the marker with it: nothing then shows that a database existed, and a new
one is made, as on a first start.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from db.errors import DatabaseMissing


def marker_path(database_path: Path) -> Path:
    """The marker of a database: beside it, named after it."""
    return database_path.with_name(database_path.name + ".created")


def refuse_if_lost(database_path: Path) -> None:
    """Raise DatabaseMissing when there is no database at the path but its marker says there was one."""
    marker = marker_path(database_path)
    if database_path.exists() or not marker.is_file():
        return
    try:
        created = marker.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        created = ""
    when = f" on {created}" if created else ""
    raise DatabaseMissing(
        f"the database {database_path} is missing, but {marker.name} beside it shows one was created there{when}: "
        f"put the file back (or restore a backup), or start a new, empty database on purpose with "
        f"`qwenbot run --new-database` (or `qwenbot migrate --new-database`)")


def mark_created(database_path: Path) -> None:
    """Write the marker, unless there is one (0600, like the database beside it)."""
    marker = marker_path(database_path)
    if marker.exists():
        return
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # another process wrote it just now
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(stamp + "\n")
