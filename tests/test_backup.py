"""`qwenbot backup` and `qwenbot restore` (db/backup.py): a backup taken while turns commit is whole and holds
every turn committed before it began; a restore is refused while a bot serves the database, checks the backup before
touching anything, replaces the file in one step, keeps the old one, and leaves no WAL behind to undo it.

Issue 43's probe: copying a backup over bot.sqlite3 while the bot was stopped left the old `-wal` beside it, and the
next start replayed it over the restored pages (the restore undone). `test_a_restore_is_not_undone_by_the_old_wal`
shows that happening to a plain copy first, then not to a restore.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path

import pytest

from bot.program.cli import main
from db import BackupError, DatabaseInUse, InstanceLock, open_database
from db.backup import backup_database, restore_database
from tests.fakes.telegram_bot import ALICE, final, private_chat, running_bot, telegram_server
from tests.fakes.telegram_server import User

__all__ = ["telegram_server"]  # the fixture, used by name

ROOT = Path(__file__).resolve().parent.parent
CHATS = [User(7001 + index, f"Member{index}", "en") for index in range(8)]


def rows(path: Path, sql: str) -> list[tuple]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql).fetchall()


def integrity(path: Path) -> list[str]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return [row[0] for row in conn.execute("PRAGMA integrity_check")]


async def make_database(path: Path, courses: list[str]) -> None:
    """A migrated database holding `courses` as extra course rows (something to tell two databases apart by)."""
    db = await open_database(path)
    async with db.transaction() as conn:
        for name in courses:
            await conn.execute("INSERT INTO courses (name, lessons, updates_per_week, hours_per_update) "
                               "VALUES (?, 1, 1, 1)", (name,))
    await db.close()


def course_names(path: Path) -> set[str]:
    return {name for (name,) in rows(path, "SELECT name FROM courses")}


# ── backup ──────────────────────────────────────────────────────────────────────────────────────────────────────

async def test_a_backup_taken_during_8_concurrent_turns_is_whole_and_holds_every_turn_committed_before_it(
        telegram_server, tmp_path):
    questions = 3  # per chat: turns keep committing before, during and after the backup
    replies = [final(f"answer {n}") for n in range(len(CHATS) * questions)]
    bot = await running_bot(telegram_server, tmp_path, replies, delay=0.3,
                            allowed_user_ids=frozenset(user.id for user in CHATS), max_pending_questions=50)
    try:
        for round_ in range(questions):
            for user in CHATS:
                telegram_server.send_text(private_chat(user), user, f"{user.first_name} question {round_}")
        await telegram_server.wait_for(lambda: len(telegram_server.sent_texts()) >= len(CHATS), 30, "first answers")
        committed = {row[0] for row in await bot.db.fetchall("SELECT id FROM turns")}
        backup = tmp_path / "backups" / "during.sqlite3"
        report = await asyncio.to_thread(backup_database, bot.settings.storage.database_path, backup)
        in_flight = len(CHATS) * questions - len(committed)
        await bot.turns_done(30)
        total = {row[0] for row in await bot.db.fetchall("SELECT id FROM turns")}
    finally:
        await bot.stop()
    assert in_flight > 0 and len(total) == len(CHATS) * questions  # the backup really ran beside working turns
    assert report.path == backup and report.size_bytes == backup.stat().st_size
    assert integrity(backup) == ["ok"]
    saved = {row[0] for row in rows(backup, "SELECT id FROM turns")}
    assert committed <= saved <= total
    # A turn's rows are whole in the copy: every saved turn has its question and answer in the history.
    assert rows(backup, "SELECT count(*) FROM turns t WHERE NOT EXISTS (SELECT 1 FROM messages m "
                        "WHERE m.turn_id = t.id AND m.role = 'assistant')") == [(0,)]
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600  # it holds every chat's history
    assert not list(backup.parent.glob("*.part"))
    # One self-contained file: no WAL mode, so it can be copied alone.
    assert rows(backup, "PRAGMA journal_mode") == [("delete",)]


async def test_qwenbot_backup_names_a_dated_file_in_a_folder_and_refuses_to_overwrite_the_database(
        logging_restored, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TOKENIZER_VOCAB_PATH", str(tmp_path / "absent.tiktoken"))
    await make_database(tmp_path / "bot.sqlite3", ["backed-up course"])
    assert main(["backup", f"{tmp_path / 'backups'}{os.sep}"]) == 0
    (written,) = (tmp_path / "backups").iterdir()
    assert written.name.startswith("bot-") and written.suffix == ".sqlite3"
    assert "backed-up course" in course_names(written)
    assert f"backed up {tmp_path / 'bot.sqlite3'} to {written}" in capsys.readouterr().out

    assert main(["backup", str(tmp_path / "bot.sqlite3")]) == 2
    assert "would overwrite the database itself" in capsys.readouterr().err
    assert "backed-up course" in course_names(tmp_path / "bot.sqlite3")


# ── restore: (a) refused while a bot serves the database ────────────────────────────────────────────────────────

async def test_a_restore_is_refused_while_a_bot_serves_the_database_and_changes_nothing(telegram_server, tmp_path):
    backup = tmp_path / "old.sqlite3"
    await make_database(backup, ["from the backup"])
    bot = await running_bot(telegram_server, tmp_path, [final("still here")])
    try:
        assert (await bot.ask(private_chat(ALICE), ALICE, "hello")).startswith("still here")
        target = bot.settings.storage.database_path
        before = target.read_bytes()
        with pytest.raises(DatabaseInUse) as refused:
            await asyncio.to_thread(restore_database, backup, target)
        assert str(refused.value) == (f"a qwenbot run (pid {os.getpid()}) is serving the database {target}: stop "
                                      f"it, then restore (nothing was changed)")
        assert target.read_bytes() == before
        assert not target.with_name("bot.sqlite3.before-restore").exists()
        assert rows(target, "SELECT count(*) FROM turns") == [(1,)]
    finally:
        await bot.stop()


def test_qwenbot_restore_run_beside_a_serving_process_exits_2_with_one_line(tmp_path):
    """Across processes, as an operator meets it: the lock is held by another process."""
    target = tmp_path / "bot.sqlite3"
    asyncio.run(make_database(target, ["live"]))
    asyncio.run(make_database(tmp_path / "old.sqlite3", ["old"]))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from db import InstanceLock
        assert InstanceLock(__import__("pathlib").Path({str(target)!r})).try_acquire()
        print("locked", flush=True)
        sys.stdin.read()
    """)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        env = {**os.environ, "DATA_DIR": str(tmp_path), "TOKENIZER_VOCAB_PATH": str(tmp_path / "absent")}
        done = subprocess.run([sys.executable, "-m", "bot.program.cli", "restore", str(tmp_path / "old.sqlite3")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    finally:
        holder.communicate("", timeout=30)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"qwenbot: a qwenbot run (pid {holder.pid}) is serving the database {target}: stop it, then restore "
        f"(nothing was changed)")
    assert course_names(target) >= {"live"} and "old" not in course_names(target)


# ── restore: (b) the old WAL cannot undo it ─────────────────────────────────────────────────────────────────────

def leave_uncheckpointed_rows(path: Path, courses: list[str]) -> None:
    """A process writes `courses` and dies without closing its connection: the rows live only in `-wal`, as after
    a crash or a SIGKILL (a closing connection would checkpoint them into the file and remove the WAL)."""
    subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, sqlite3
        conn = sqlite3.connect({str(path)!r}, isolation_level=None)
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        for name in {courses!r}:
            conn.execute("INSERT INTO courses (name, lessons, updates_per_week, hours_per_update) "
                         "VALUES (?, 1, 1, 1)", (name,))
        os._exit(0)
    """)], check=True, timeout=60)
    assert path.with_name(path.name + "-wal").stat().st_size > 0


async def test_a_restore_is_not_undone_by_the_old_wal(tmp_path):
    # The probe: a plain copy over a stopped bot's database, its WAL left beside it.
    copied = tmp_path / "copied" / "bot.sqlite3"
    copied.parent.mkdir()
    await make_database(copied, ["before the backup"])
    backup_database(copied, tmp_path / "backup.sqlite3")
    leave_uncheckpointed_rows(copied, ["after the backup"])
    shutil.copyfile(tmp_path / "backup.sqlite3", copied)
    db = await open_database(copied)  # the next start
    await db.close()
    assert "after the backup" in course_names(copied)  # the WAL replayed over the copy: the restore undone

    # The same with qwenbot restore.
    target = tmp_path / "restored" / "bot.sqlite3"
    target.parent.mkdir()
    await make_database(target, ["before the backup"])
    backup_database(target, tmp_path / "backup2.sqlite3")
    leave_uncheckpointed_rows(target, ["after the backup"])
    report = restore_database(tmp_path / "backup2.sqlite3", target)
    assert not target.with_name("bot.sqlite3-wal").exists() and not target.with_name("bot.sqlite3-shm").exists()
    db = await open_database(target)
    await db.close()
    names = course_names(target)
    assert "before the backup" in names and "after the backup" not in names
    # What the WAL held is not lost either: it is in the copy kept beside the database.
    assert report.previous == target.with_name("bot.sqlite3.before-restore")
    assert {"before the backup", "after the backup"} <= course_names(report.previous)
    assert integrity(report.previous) == ["ok"]


# ── restore: (c) the backup is checked first, and the swap is one step ──────────────────────────────────────────

def corrupt(path: Path) -> None:
    """Overwrite the middle of a database's last page (a table's b-tree page, not the header)."""
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.seek(size - 2048)
        file.write(b"\xff" * 1024)


async def newer_database(path: Path) -> None:
    await make_database(path, [])
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("INSERT INTO schema_migrations (name) VALUES ('9999_from_the_future')")
        conn.commit()


async def foreign_database(path: Path) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
        conn.execute("INSERT INTO notes VALUES ('not ours')")
        conn.commit()


async def damaged_database(path: Path) -> None:
    await make_database(path, [f"course {n}" for n in range(200)])
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
    corrupt(path)


async def text_file(path: Path) -> None:
    path.write_text("these are my notes, not a database\n" * 100)


@pytest.mark.parametrize("make_backup, reason", [
    (text_file, "not a database"),
    (damaged_database, "malformed"),
    (foreign_database, "not a qwenbot database (it has no schema_migrations)"),
    (newer_database, "made by a newer qwenbot (migration 9999_from_the_future is unknown here): upgrade first"),
])
async def test_a_backup_that_is_not_an_intact_qwenbot_database_is_refused_before_anything_changes(
        tmp_path, make_backup, reason):
    target = tmp_path / "bot.sqlite3"
    await make_database(target, ["live"])
    leave_uncheckpointed_rows(target, ["only in the wal"])
    files_before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    await make_backup(tmp_path / "backup.sqlite3")
    with pytest.raises(BackupError) as refused:
        restore_database(tmp_path / "backup.sqlite3", target)
    message = str(refused.value)
    assert message.startswith(f"cannot restore {tmp_path / 'backup.sqlite3'}: ") and reason in message
    assert message.endswith("; nothing was changed")
    after = {path.name: path.read_bytes() for path in tmp_path.iterdir() if not path.name.startswith("backup.")}
    after.pop("bot.sqlite3.lock", None)
    files_before.pop("bot.sqlite3.lock", None)
    assert after == files_before  # the database and its WAL untouched; no .restoring, no .before-restore
    assert {"live", "only in the wal"} <= course_names(target)


async def test_a_restore_replaces_the_file_in_one_step_and_keeps_the_old_one(tmp_path, monkeypatch):
    target = tmp_path / "bot.sqlite3"
    await make_database(target, ["live"])
    await make_database(tmp_path / "source.sqlite3", ["restored"])
    backup_database(tmp_path / "source.sqlite3", tmp_path / "backup.sqlite3")
    renames: list[tuple[str, str]] = []
    real_replace = os.replace

    def recording_replace(src, dst):
        renames.append((Path(src).name, Path(dst).name))
        assert not InstanceLock(target).try_acquire()  # a bot starting now waits for the restore to finish
        assert course_names(Path(src)) >= ({"restored"} if Path(dst) == target else {"live"})
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", recording_replace)
    report = restore_database(tmp_path / "backup.sqlite3", target)
    # The new file is written beside the database, whole and checked, then renamed over it: at every moment the
    # path holds either the old database or the new one.
    assert renames == [("bot.sqlite3.before-restore.part", "bot.sqlite3.before-restore"),
                       ("bot.sqlite3.restoring", "bot.sqlite3")]
    assert "restored" in course_names(target) and "live" not in course_names(target)
    assert "live" in course_names(report.previous)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not list(tmp_path.glob("*.restoring")) and not list(tmp_path.glob("*.part"))
    assert report.pending == ()


async def test_an_older_backup_is_restored_and_migrated_at_the_next_open(logging_restored, tmp_path, capsys,
                                                                         monkeypatch):
    from db.migrate import MIGRATIONS_FOLDER, discover

    old_folder = tmp_path / "old-migrations"
    old_folder.mkdir()
    first_three = sorted(MIGRATIONS_FOLDER.glob("000[1-3]_*.sql"))
    for path in first_three:
        shutil.copy(path, old_folder)
    old = await open_database(tmp_path / "old.sqlite3", migrations_folder=old_folder)
    await old.close()
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TOKENIZER_VOCAB_PATH", str(tmp_path / "absent.tiktoken"))
    assert main(["restore", str(tmp_path / "old.sqlite3")]) == 0
    out = capsys.readouterr().out
    pending = [m.name for m in discover()][3:]
    assert f"restored {tmp_path / 'bot.sqlite3'} from {tmp_path / 'old.sqlite3'} (schema 0003_courses" in out
    assert f"{len(pending)} newer migration(s) apply at the next start or `qwenbot migrate`" in out
    assert "kept in" not in out  # there was no database before
    db = await open_database(tmp_path / "bot.sqlite3")
    await db.close()
    assert db.applied == pending
