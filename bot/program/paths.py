"""Where the bot keeps its files, whatever folder `qwenbot` is started from.

One rule: every path setting (the database, Qwen's tiktoken vocabulary, the model cache, converted GGUF models, a
local MODEL) that is relative resolves against the data directory, and the data directory is

1. `DATA_DIR`, when set (an absolute path, `~` allowed);
2. otherwise `data/` beside the project, when the code runs from a checkout (`scripts/setup.sh` installs it
   editable, so `scripts/run.sh`, `.venv/bin/qwenbot` and a container all land here);
3. otherwise the per-user data folder of the platform (`~/.local/share/qwenbot` on Linux, via platformdirs), for
   a copy installed as a plain package, which has no project folder to sit beside.

The `.env` file is read from the project folder in a checkout, and from the current folder otherwise.
"""

from __future__ import annotations

from pathlib import Path

import platformdirs

APP_NAME = "qwenbot"


def project_root() -> Path | None:
    """The checkout this code runs from (the folder holding `pyproject.toml` and `bot/`), or None."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() else None


def default_data_dir() -> Path:
    """The data directory when DATA_DIR is not set: `data/` in the checkout, else the per-user data folder."""
    root = project_root()
    if root is not None:
        return root / "data"
    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def dotenv_file() -> Path:
    """The `.env` to read: the project's in a checkout, the current folder's otherwise."""
    root = project_root()
    return (root if root is not None else Path.cwd()) / ".env"


def under(data_dir: Path, path: Path) -> Path:
    """`path` made absolute: `~` expanded, a relative path taken inside `data_dir`."""
    return data_dir / path.expanduser()  # joining an absolute path keeps it as it is



def moved_database(data_dir: Path, setting: Path) -> Path | None:
    """The database a relative DATABASE_PATH meant before paths were taken inside DATA_DIR, if it is there.

    `.env` files copied from the old `.env.example` say `DATABASE_PATH=data/bot.sqlite3`, which used to be
    relative to the project folder; inside DATA_DIR it would name a new, empty database and hide the real one.
    """
    if setting.is_absolute() or setting.parts[:1] != (data_dir.name,):
        return None
    old = data_dir.parent / setting
    return old if old.is_file() and not (data_dir / setting).exists() else None
