"""The files the database layer creates are private to their owner: folders 0700, files 0600, whatever the umask.

The database holds every chat's history; SQLite gives its -wal and -shm files the database file's mode, and the
instance lock file sits beside it. Folders and files that exist already are left as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

from db.errors import DatabaseOpenError


def make_private_folders(folder: Path) -> None:
    """Create `folder` and its missing parents, each 0700."""
    for missing in reversed([p for p in (folder, *folder.parents) if not p.exists()]):
        missing.mkdir(mode=0o700, exist_ok=True)


def create_private(path: Path) -> None:
    """Create the file at `path` (0600) and its missing folders (0700), unless it exists; a path that cannot be
    created is a `DatabaseOpenError` that says which part failed."""
    try:
        make_private_folders(path.parent)
        if not path.exists():
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError as error:
        raise DatabaseOpenError(f"cannot open the database {path}: cannot create "
                                f"{error.filename or path}: {error.strerror or error}") from error
