"""Paths that do not depend on the folder: `qwenbot` started from anywhere uses the same data directory.

Each test copies the code into a temporary "clone" (or a plain install, without pyproject.toml) and runs
`python -m bot.program.cli` there as a user would, from two different folders, with no path setting at all.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

from bot.program.config import Settings

ROOT = Path(__file__).resolve().parent.parent
SETTING_NAMES = set(Settings.variables())


def copy_code(destination: Path, *, checkout: bool) -> Path:
    """The project's packages (every top-level folder with an __init__.py), and pyproject.toml for a checkout."""
    destination.mkdir(parents=True)
    for package in ROOT.iterdir():
        if (package / "__init__.py").is_file() and package.name != "tests":
            shutil.copytree(package, destination / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    if checkout:
        shutil.copy(ROOT / "pyproject.toml", destination)
    return destination


def qwenbot_from(code: Path, folder: Path, *args: str, home: Path) -> subprocess.CompletedProcess:
    """`qwenbot ARGS` started in `folder`, running the code in `code`, with no setting in its environment."""
    folder.mkdir(parents=True, exist_ok=True)
    clean = {k: v for k, v in os.environ.items() if k not in SETTING_NAMES and not k.startswith("XDG_")}
    env = {**clean, "PYTHONPATH": str(code), "HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "bot.program.cli", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=60)


def test_migrate_from_two_folders_of_a_clone_uses_the_same_database(tmp_path):
    clone = copy_code(tmp_path / "clone", checkout=True)
    first = qwenbot_from(clone, tmp_path / "somewhere", "migrate", home=tmp_path / "home")
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[0] == "applied 0001_chats_and_messages"

    second = qwenbot_from(clone, tmp_path / "elsewhere" / "deeper", "migrate", home=tmp_path / "home")
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == f"{clone / 'data' / 'bot.sqlite3'} is up to date"

    assert sorted(p.name for p in (clone / "data").iterdir() if p.suffix == ".sqlite3") == ["bot.sqlite3"]
    for folder in (tmp_path / "somewhere", tmp_path / "elsewhere"):
        assert not any(folder.rglob("*.sqlite3")), f"a database was created in {folder}"


def test_an_installed_copy_without_a_project_uses_the_per_user_data_folder(tmp_path):
    installed = copy_code(tmp_path / "site-packages", checkout=False)
    home = tmp_path / "home"
    first = qwenbot_from(installed, tmp_path / "a", "migrate", home=home)
    second = qwenbot_from(installed, tmp_path / "b", "migrate", home=home)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    database = home / ".local" / "share" / "qwenbot" / "bot.sqlite3"
    assert second.stdout.strip() == f"{database} is up to date"
    with sqlite3.connect(database) as conn:
        assert conn.execute("SELECT count(*) FROM courses").fetchone() == (4,)


def test_the_start_log_names_the_database_and_the_model(tmp_path):
    clone = copy_code(tmp_path / "clone", checkout=True)
    replies = tmp_path / "replies.json"
    replies.write_text('["Thought: easy\\nFinal Answer: 42"]', encoding="utf-8")
    (clone / ".env").write_text(f"LLM_BACKEND=scripted\nSCRIPTED_REPLIES_PATH={replies}\n", encoding="utf-8")
    done = qwenbot_from(clone, tmp_path / "anywhere", "ask", "6*7?", home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"
    assert f"database {clone / 'data' / 'bot.sqlite3'}" in done.stderr
    assert "model scripted backend" in done.stderr


def test_a_relative_model_path_is_found_in_the_data_dir_not_the_current_folder(tmp_path, monkeypatch):
    from agent.llm.engine.loading import resolve_model

    (tmp_path / "data" / "models").mkdir(parents=True)
    (tmp_path / "data" / "models" / "mine.gguf").write_bytes(b"GGUF")
    (tmp_path / "data" / "qwen-folder").mkdir()
    monkeypatch.chdir(tmp_path)  # a models/mine.gguf here must not be what it finds
    source = resolve_model("models/mine.gguf", tmp_path / "data")
    assert (source.location, source.gguf_file, source.hub) == (str(tmp_path / "data" / "models"), "mine.gguf", False)
    assert resolve_model("qwen-folder", tmp_path / "data").location == str(tmp_path / "data" / "qwen-folder")
    assert resolve_model("Qwen/Qwen2.5-7B-Instruct", tmp_path / "data").hub
