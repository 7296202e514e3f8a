"""Shared fixtures: a real, migrated SQLite file in a temporary folder, and the shipped tool registry.

Other test modules append their own fixtures here; keep each one small and generic.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_asyncio

from db import Database, open_database
from tools import ToolRegistry, build_registry
from tools.registry import tools_for_turn


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


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def turn_tools(tmp_path_factory):
    """The shipped tools as a turn sees them (course_query narrowed to the seeded course names), once per module."""
    database = await open_database(tmp_path_factory.mktemp("db") / "bot.sqlite3")
    yield await tools_for_turn(build_registry(database))
    await database.close()


@pytest.fixture
def logging_restored():
    """The root logger's handlers and level put back after a test that runs `qwenbot` in-process (`main` calls
    configure_logging, whose handler writes to the test's captured stderr, closed once the test ends)."""
    import logging

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
