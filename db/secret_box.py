"""Secrets at rest: sealed with a key kept outside the database, so that the database file alone gives none away.

    box = SecretBox.at(settings.storage.secrets_key_file)    # the key file, created (0600) on first use
    sealed = box.seal('{"Authorization": "Bearer …"}')       # what the database stores
    box.open(sealed)                                          # the text again; SecretKeyError with another key

The database is the file that gets copied around: backups, a copy for `qwenbot eval`, a bug report. MCP servers'
headers and URL credentials are the only secrets it would hold, so they are sealed with Fernet (AES-128-CBC and
HMAC-SHA256, from the `cryptography` package): authenticated encryption, so a wrong key or a changed value is
an error, never garbage. The key is a file of its own, beside the database by default (SECRETS_KEY_PATH), made
private (0600) on first use: a copy of the database without the key shows the servers' names and public URLs,
not their secrets. Keep the key with the database's backups, but not inside them.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from db.errors import SecretKeyError
from db.files import make_private_folders

KEY_FILE_NAME = "secrets.key"  # beside the database, unless SECRETS_KEY_PATH says otherwise


def key_file_beside(database_path: Path) -> Path:
    """Where the key lives by default: a file of its own in the database's folder."""
    return Path(database_path).parent / KEY_FILE_NAME


class SecretBox:
    """Seals and opens text with one Fernet key."""

    def __init__(self, key: bytes, path: Path | None = None):
        self._fernet = Fernet(key)
        self.path = path  # where the key came from, for messages

    @classmethod
    def at(cls, path: Path) -> "SecretBox":
        """The box whose key is in the file at `path`, creating the file (0600, its folders 0700) if missing."""
        try:
            return cls(_read_or_create_key(path), path)
        except (OSError, ValueError) as error:
            raise SecretKeyError(f"cannot use the secrets key {path}: {error}; check SECRETS_KEY_PATH") from None

    def seal(self, text: str) -> str:
        """`text`, encrypted and authenticated, as ASCII."""
        return self._fernet.encrypt(text.encode("utf-8")).decode("ascii")

    def open(self, sealed: str) -> str:
        """The text `seal` sealed; SecretKeyError when it was sealed with another key (or changed since)."""
        try:
            return self._fernet.decrypt(sealed.encode("ascii")).decode("utf-8")
        except (InvalidToken, ValueError):
            raise SecretKeyError(f"secrets in the database were sealed with another key than the one in "
                                 f"{self.path or 'use'}: restore that key file (SECRETS_KEY_PATH), or add the "
                                 "MCP servers again") from None


def _read_or_create_key(path: Path) -> bytes:
    """The key in `path`; a new one written there first if the file does not exist (two processes starting at once
    agree: only one creates it)."""
    if not path.exists():
        make_private_folders(path.parent)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process made it a moment ago
        else:
            with os.fdopen(descriptor, "wb") as file:
                file.write(Fernet.generate_key() + b"\n")
    key = path.read_bytes().strip()
    Fernet(key)  # ValueError for anything that is not a Fernet key
    return key
