"""Shared fixtures: a real, migrated SQLite file in a temporary folder, and the shipped tool registry.

Other test modules append their own fixtures here; keep each one small and generic.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from db import Database, open_database
from tools import ToolRegistry, build_registry


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """Where the test's database file lives (not created until `db` opens it)."""
    return tmp_path / "bot.sqlite3"


@pytest.fixture
async def db(db_path: Path):
    """The bot's database, migrated, in a fresh file; closed after the test."""
    database: Database = await open_database(db_path)
    yield database
    await database.close()


@pytest.fixture
def registry(db: Database) -> ToolRegistry:
    """Every tool the bot ships, over the test's database."""
    return build_registry(db, timeout_seconds=5.0)
