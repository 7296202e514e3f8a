"""`qwenbot migrate` and `qwenbot tools`, run as real processes against a database file in a temp folder."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from bot.program.config import Settings
from db import open_database
from db.migrate import MIGRATIONS_FOLDER, discover
from tests.test_migrations import write

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = [m.name for m in discover(MIGRATIONS_FOLDER)]
SETTING_NAMES = set(Settings.variables())


def qwenbot(*args: str, **env: str) -> subprocess.CompletedProcess:
    """Run `qwenbot ARGS` with only `env` as settings (none inherited from the test's own environment)."""
    clean = {k: v for k, v in os.environ.items() if k not in SETTING_NAMES}
    return subprocess.run([sys.executable, "-m", "bot.program.cli", *args], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=60)


def courses(path: Path) -> list[tuple]:
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT name, lessons, updates_per_week, hours_per_update FROM courses ORDER BY id").fetchall()


def test_migrate_creates_the_database_then_applies_nothing(tmp_path):
    path = tmp_path / "new" / "bot.sqlite3"
    first = qwenbot("migrate", DATABASE_PATH=str(path))
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [f"applied {name}" for name in SHIPPED]
    assert first.stdout.splitlines()[:6] == [
        "applied 0001_chats_and_messages", "applied 0002_turn_traces", "applied 0003_courses",
        "applied 0004_tool_settings", "applied 0005_audit_log", "applied 0006_access_lists"]
    assert courses(path) == [("大模型技术实战", 200, 3, 2.0), ("机器学习实战", 230, 2, 1.5),
                             ("深度学习实战", 150, 1, 3.0), ("AI数据分析", 10, 1, 1.0)]

    second = qwenbot("migrate", DATABASE_PATH=str(path))
    assert second.returncode == 0, second.stderr
    assert "applied" not in second.stdout
    assert second.stdout.strip() == f"{path} is up to date"
    assert len(courses(path)) == 4
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM schema_migrations").fetchone() == (len(SHIPPED),)


def test_migrate_in_a_fresh_clone_creates_its_database_in_the_clones_empty_data_dir(tmp_path):
    # The tree as a clone has it (no data/, no .venv): migrate finds the .sql files in its top-level migrations/.
    clone = tmp_path / "clone"
    shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(".git", ".venv", ".cache", "data", "__pycache__",
                                                               ".pytest_cache", "*.egg-info", ".env"))
    clean = {k: v for k, v in os.environ.items() if k not in SETTING_NAMES}
    result = subprocess.run([sys.executable, "-m", "bot.program.cli", "migrate"], cwd=clone,
                            env={**clean, "PYTHONPATH": str(clone)}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    shipped = sorted(path.stem for path in (clone / "migrations").glob("*.sql"))
    assert result.stdout.splitlines() == [f"applied {name}" for name in shipped] and shipped == SHIPPED
    assert len(courses(clone / "data" / "bot.sqlite3")) == 4


def test_migrate_brings_a_database_of_the_previous_schema_up_to_date_and_keeps_its_data(tmp_path):
    path = tmp_path / "bot.sqlite3"
    previous = write(tmp_path / "previous", {f"{name}.sql": (MIGRATIONS_FOLDER / f"{name}.sql").read_text("utf-8")
                                              for name in SHIPPED[:-1]})

    async def build_previous() -> None:
        db = await open_database(path, migrations_folder=previous)
        async with db.transaction() as conn:
            await conn.execute("INSERT INTO courses (name, lessons, updates_per_week, hours_per_update) "
                               "VALUES ('强化学习实战', 120, 2, 1.5)")
        await db.close()

    asyncio.run(build_previous())
    result = qwenbot("migrate", DATABASE_PATH=str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"applied {SHIPPED[-1]}"]
    assert courses(path)[-1] == ("强化学习实战", 120, 2, 1.5) and len(courses(path)) == 5
    with sqlite3.connect(path) as conn:
        assert [name for name, in conn.execute("SELECT name FROM schema_migrations ORDER BY rowid")] == SHIPPED


def test_a_bad_setting_is_one_line_and_exit_status_2(tmp_path):
    path = tmp_path / "bot.sqlite3"
    result = qwenbot("migrate", DATABASE_PATH=str(path), MAX_STEPS="abc")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["qwenbot: MAX_STEPS must be a whole number, got 'abc'"]
    assert result.stdout == ""
    assert "Traceback" not in result.stdout + result.stderr
    assert not path.exists()  # it stopped before touching the database


def test_an_unknown_backend_and_a_bad_log_level_are_one_line_too(tmp_path):
    for variable, value in (("LLM_BACKEND", "foo"), ("LOG_LEVEL", "loud"), ("ADMIN_USER_IDS", "1,x")):
        result = qwenbot("migrate", DATABASE_PATH=str(tmp_path / "bot.sqlite3"), **{variable: value})
        assert result.returncode == 2
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"qwenbot: {variable} must be"), result.stderr
        assert "Traceback" not in result.stdout + result.stderr


def test_a_database_path_that_is_a_folder_or_not_sqlite_is_one_line(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("not a database " * 100)
    for path in (tmp_path, junk):
        result = qwenbot("migrate", DATABASE_PATH=str(path))
        assert result.returncode == 2
        assert result.stderr.splitlines() == [result.stderr.strip()]
        assert result.stderr.startswith(f"qwenbot: cannot open the database {path}")
        assert "Traceback" not in result.stdout + result.stderr


def test_tools_lists_every_tool_with_its_state(tmp_path):
    path = tmp_path / "bot.sqlite3"
    result = qwenbot("tools", DATABASE_PATH=str(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines][:3] == [["on", "course_query"], ["on", "course_list"],
                                                        ["on", "calculator"]]
    assert all(line.endswith("(default)") for line in lines)


def test_tools_shows_global_and_chat_settings_from_the_database(tmp_path):
    path = tmp_path / "bot.sqlite3"
    assert qwenbot("migrate", DATABASE_PATH=str(path)).returncode == 0
    with sqlite3.connect(path) as conn:
        conn.executemany("INSERT INTO tool_settings (scope, tool_name, enabled) VALUES (?, ?, ?)",
                         [("global", "calculator", 0), ("tg:42", "calculator", 1), ("tg:42", "course_list", 0)])

    everywhere = qwenbot("tools", DATABASE_PATH=str(path)).stdout.splitlines()
    assert [line.split()[:2] for line in everywhere][:3] == [["on", "course_query"], ["on", "course_list"],
                                                             ["off", "calculator"]]
    assert everywhere[2].endswith("(global)")

    in_chat = qwenbot("tools", "--chat", "tg:42", DATABASE_PATH=str(path)).stdout.splitlines()
    assert [line.split()[:2] for line in in_chat][:3] == [["on", "course_query"], ["off", "course_list"],
                                                          ["on", "calculator"]]
    assert in_chat[1].endswith("(chat)") and in_chat[2].endswith("(chat)")


def test_the_console_script_is_installed():
    script = Path(sys.executable).parent / "qwenbot"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert "migrate" in result.stdout and "tools" in result.stdout
