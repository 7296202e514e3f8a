"""`qwenbot doctor`: every check passes on a good setup (exit 0); each broken piece fails its own line (exit 1).

The Bot API is the fake Telegram server and the model server the fake OpenAI server, both real HTTP on
127.0.0.1; the database is a real file. Each failure test starts from the good setup and breaks one thing.
"""

from __future__ import annotations

import errno
import io
import os
import socket
import sqlite3
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from bot.program.config import Settings
from bot.program.doctor import Status, diagnose, report, unwritable
from db import InstanceLock, open_database
from db.marker import marker_path
from tests.fakes.openai_server import FakeOpenAIServer, error, text
from tests.fakes.telegram_server import FakeTelegramServer

ROOT = Path(__file__).resolve().parent.parent
VOCAB = ROOT / "data" / "qwen.tiktoken"
GGUF = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SETTING_NAMES = set(Settings.variables())


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def telegram():
    """The fake Bot API server."""
    with FakeTelegramServer() as server:
        yield server


@pytest.fixture
def model_server():
    """A fake model server answering "OK" to every request the doctor makes."""
    with FakeOpenAIServer() as server:
        server.add(*[text("OK")] * 4)
        yield server


@pytest.fixture
async def good(tmp_path, telegram, model_server) -> Settings:
    """A setup where everything is right: migrated database, token, served model with tools, vocabulary."""
    if not VOCAB.is_file():
        pytest.fail(f"{VOCAB} is missing: run scripts/fetch_assets.sh (scripts/test.sh does)")
    settings = Settings.of(data_dir=tmp_path, telegram_bot_token=telegram.token, telegram_base_url=telegram.base_url,
                           llm_backend="openai", openai_base_url=model_server.base_url, openai_model="fake-qwen",
                           agent_mode="native", tokenizer_vocab_path=VOCAB, doctor_min_free_disk_mb=1,
                           doctor_timeout_seconds=5.0, openai_first_token_seconds=5.0, openai_startup_seconds=5.0,
                           openai_max_retries=0)
    await (await open_database(settings.storage.database_path)).close()
    return settings


def outcome(checks) -> dict[str, Status]:
    """Each check's status by name."""
    return {check.name: check.status for check in checks}


def line_of(checks, name: str) -> str:
    """The report line of the check called `name`."""
    return next(check.line() for check in checks if check.name == name)


def only_failure(checks, name: str, *, skipped: tuple[str, ...] = ()) -> str:
    """Assert `name` is the one failed check (others ok, or skipped as named); return its line."""
    expected = {check.name: Status.OK for check in checks} | {name: Status.FAIL} | dict.fromkeys(skipped, Status.SKIP)
    assert outcome(checks) == expected
    line = line_of(checks, name)
    assert line.startswith(f"FAIL  {name}") and "  fix: " in line and "\n" not in line
    return line


async def test_all_good_prints_a_line_per_check_and_exits_0(good, telegram, model_server, capsys):
    checks = await diagnose(good)
    assert [c.name for c in checks] == ["settings", "data dir", "disk", "database", "instance", "vocab", "bot api",
                                        "token", "model", "chat", "tools"]
    assert all(c.status is Status.OK for c in checks)
    assert line_of(checks, "token") == "ok    token      accepted: @qwen_test_bot (id 777000)"
    assert telegram.calls_to("getMe")
    tools_request = model_server.chat_requests[-1].body
    assert tools_request["max_tokens"] == 1 and tools_request["tools"][0]["function"]["name"] == "calculator"
    out = io.StringIO()
    assert report(checks, out) == 0
    assert len(out.getvalue().splitlines()) == len(checks)


async def test_a_data_dir_that_cannot_be_created_fails(good, tmp_path):
    (tmp_path / "a-file").write_text("x")
    settings = good.replaced(data_dir=tmp_path / "a-file" / "data")
    checks = await diagnose(settings)
    assert outcome(checks)["data dir"] is Status.FAIL
    assert "set DATA_DIR to a folder this user can write" in line_of(checks, "data dir")


async def test_too_little_disk_fails(good):
    line = only_failure(await diagnose(good.replaced(doctor_min_free_disk_mb=10**12)), "disk")
    assert "less than DOCTOR_MIN_FREE_DISK_MB=1000000000000" in line


async def test_no_database_yet_fails_with_migrate_as_the_fix(good):
    good.storage.database_path.unlink()
    marker_path(good.storage.database_path).unlink()  # never created: nothing shows there was one
    line = only_failure(await diagnose(good), "database")
    assert "no database at" in line and "run `qwenbot migrate`" in line
    assert not good.storage.database_path.exists()  # the doctor changes nothing


async def test_a_lost_database_fails_with_restore_or_new_database_as_the_fix(good):
    good.storage.database_path.unlink()  # its marker says it existed (db/marker.py)
    line = only_failure(await diagnose(good), "database")
    assert "is missing, but bot.sqlite3.created shows one was created there" in line
    assert "restore a backup" in line and "`qwenbot migrate --new-database`" in line
    assert not good.storage.database_path.exists()


async def test_a_database_missing_a_migration_fails(good):
    with sqlite3.connect(good.storage.database_path) as conn:
        (last,) = conn.execute("SELECT name FROM schema_migrations ORDER BY name DESC LIMIT 1").fetchone()
        conn.execute("DELETE FROM schema_migrations WHERE name = ?", (last,))
    line = only_failure(await diagnose(good), "database")
    assert f"1 migration(s) not applied ({last})" in line and "qwenbot migrate" in line


async def test_a_database_locked_by_another_process_fails(good):
    holder = sqlite3.connect(good.storage.database_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process writing, and not letting go
    try:
        line = only_failure(await diagnose(good), "database")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "locked" in line and "is another qwenbot running?" in line


async def test_a_database_another_qwenbot_serves_fails_with_its_pid(good):
    serving = InstanceLock(good.storage.database_path)
    assert serving.try_acquire()  # what `qwenbot run` holds while it serves
    try:
        line = only_failure(await diagnose(good), "instance")
    finally:
        serving.release()
    assert f"another qwenbot (pid {os.getpid()}) serves {good.storage.database_path}" in line
    assert "INSTANCE_LOCK_WAIT_SECONDS" in line
    assert outcome(await diagnose(good))["instance"] is Status.OK  # let go: free again


async def test_a_file_that_is_not_a_database_fails(good):
    good.storage.database_path.unlink()
    good.storage.database_path.write_text("not a database " * 100)
    line = only_failure(await diagnose(good), "database")
    assert "file is not a database" in line and "DATABASE_PATH must name the bot's SQLite file" in line


@contextmanager
def read_only_folder(folder: Path):
    """`folder` refuses new files to this process: its write bits off, and for root (whom permission bits do not
    stop) the immutable attribute too, as a read-only mount or a folder owned by another user would."""
    mode = folder.stat().st_mode
    folder.chmod(0o555)
    immutable = os.geteuid() == 0
    if immutable:
        subprocess.run(["chattr", "+i", str(folder)], check=True)
    try:
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(mode)


async def test_a_good_database_in_a_read_only_folder_is_never_to_be_moved_away(good):
    path = good.storage.database_path
    before = path.read_bytes()
    with read_only_folder(path.parent):
        checks = await diagnose(good)
    line = line_of(checks, "database")
    assert line.startswith("FAIL  database") and "\n" not in line
    assert "SQLite must create bot.sqlite3-wal and bot.sqlite3-shm in it" in line
    if os.geteuid() == 0:
        assert f"{path.parent} refuses writes even to its owner" in line and f"chattr -i -a {path.parent}" in line
    else:
        assert f"may not write {path.parent}" in line and "mode 0555" in line and "chmod u+w" in line
    assert "move this file away" not in line and "qwenbot migrate" not in line  # the file is fine: keep it
    assert outcome(checks)["data dir"] is Status.FAIL
    assert path.read_bytes() == before


def test_a_read_only_mount_is_named_with_what_to_change():
    reason = unwritable(Path("/"), OSError(errno.EROFS, "Read-only file system"), "SQLite must create files in it")
    assert reason.found == "/ is on a read-only mount (/; SQLite must create files in it)"
    assert reason.fix.startswith("remount it read-write (a container: mount the data volume without :ro)")
    assert "move" not in reason.fix


async def test_a_missing_vocabulary_fails_for_a_server_model(good, tmp_path):
    line = only_failure(await diagnose(good.replaced(tokenizer_vocab_path=tmp_path / "no.tiktoken")),
                        "vocab")
    assert "scripts/fetch_assets.sh" in line


async def test_no_token_fails_and_the_bot_api_is_skipped(good):
    line = only_failure(await diagnose(good.replaced(telegram_bot_token="")), "token",
                        skipped=("bot api",))
    assert "TELEGRAM_BOT_TOKEN is not set" in line and "@BotFather" in line


async def test_a_refused_token_fails(good):
    line = only_failure(await diagnose(good.replaced(telegram_bot_token="123456:wrong-token")), "token")
    assert "the Bot API refused TELEGRAM_BOT_TOKEN" in line
    assert "wrong-token" not in line


async def test_an_unreachable_bot_api_fails(good):
    url = f"http://127.0.0.1:{closed_port()}/bot"
    line = only_failure(await diagnose(good.replaced(telegram_base_url=url)), "bot api",
                        skipped=("token",))
    assert f"cannot reach {url}" in line and "TELEGRAM_BASE_URL" in line


async def test_an_unreachable_model_server_fails(good):
    url = f"http://127.0.0.1:{closed_port()}/v1"
    checks = await diagnose(good.replaced(openai_base_url=url))
    line = only_failure(checks, "model")
    assert f"cannot reach the model server at {url}" in line and "start the model server" in line
    assert "chat" not in outcome(checks)


async def test_a_model_the_server_does_not_serve_fails(good):
    line = only_failure(await diagnose(good.replaced(openai_model="qwen-72b")), "model")
    assert "serves fake-qwen, not qwen-72b" in line and "OPENAI_MODEL=fake-qwen" in line


async def test_a_server_that_cannot_chat_fails(good):
    with FakeOpenAIServer() as broken:
        broken.add(error(500, "no chat template"))
        checks = await diagnose(good.replaced(openai_base_url=broken.base_url))
    line = only_failure(checks, "chat")
    assert "answered 500: no chat template" in line
    assert "tools" not in outcome(checks)


async def test_a_server_without_tool_calling_fails_native_mode(good):
    with FakeOpenAIServer() as server:
        server.add(text("OK"), error(400, "tools are not supported"))
        line = only_failure(await diagnose(good.replaced(openai_base_url=server.base_url)), "tools")
    assert "tools are not supported" in line and "--tool-call-parser hermes" in line and "--jinja" in line


async def test_react_mode_does_not_ask_the_server_for_tools(good, model_server):
    checks = await diagnose(good.replaced(agent_mode="react"))
    assert "tools" not in outcome(checks) and all(c.status is Status.OK for c in checks)
    assert all("tools" not in request.body for request in model_server.chat_requests)


async def test_a_missing_local_model_file_fails(good, tmp_path):
    settings = good.replaced(llm_backend="local", model="models/nope.gguf")
    line = only_failure(await diagnose(settings), "model")
    assert f"MODEL models/nope.gguf: no such file ({tmp_path / 'models' / 'nope.gguf'})" in line


@pytest.mark.real_model
async def test_the_local_test_model_loads_renders_and_is_refused_for_native_mode(good):
    react = await diagnose(good.replaced(llm_backend="local", model=str(GGUF), agent_mode="react"))
    assert all(c.status is Status.OK for c in react)
    assert line_of(react, "model").endswith(f"loads (GGUF file in {GGUF.parent})")
    native = await diagnose(good.replaced(llm_backend="local", model=str(GGUF)))
    line = only_failure(native, "tools")  # SmolLM2's ChatML template has no tools section
    assert "use AGENT_MODE=react" in line


@pytest.mark.real_model
async def test_a_local_model_without_a_chat_template_fails(good, tmp_path):
    from transformers import AutoTokenizer, LlamaConfig

    folder = tmp_path / "base-model"
    tokenizer = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(folder)
    LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(folder)
    line = only_failure(await diagnose(good.replaced(llm_backend="local", model=str(folder))),
                        "template")
    assert "no chat template" in line and "instruct" in line


def qwenbot_doctor(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`qwenbot doctor` as a process, with only `env` as settings."""
    clean = {k: v for k, v in os.environ.items() if k not in SETTING_NAMES}
    return subprocess.run([sys.executable, "-m", "bot.program.cli", "doctor"], cwd=tmp_path,
                          env={**clean, "PYTHONPATH": str(ROOT), "DATA_DIR": str(tmp_path), **env},
                          capture_output=True, text=True, timeout=120)


def test_the_command_exits_0_when_all_is_good_and_1_when_not(good, telegram, model_server, tmp_path):
    env = {"TELEGRAM_BOT_TOKEN": telegram.token, "TELEGRAM_BASE_URL": telegram.base_url, "LLM_BACKEND": "openai",
           "OPENAI_BASE_URL": model_server.base_url, "OPENAI_MODEL": "fake-qwen", "AGENT_MODE": "native",
           "TOKENIZER_VOCAB_PATH": str(VOCAB), "DOCTOR_MIN_FREE_DISK_MB": "1"}
    passed = qwenbot_doctor(tmp_path, **env)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert len(passed.stdout.splitlines()) == 11 and passed.stderr == ""

    failed = qwenbot_doctor(tmp_path, **{**env, "TELEGRAM_BOT_TOKEN": "123456:wrong-token"})
    assert failed.returncode == 1
    assert [line.split()[0] for line in failed.stdout.splitlines()].count("FAIL") == 1


def test_a_bad_setting_is_the_settings_check_failing(tmp_path):
    done = qwenbot_doctor(tmp_path, MAX_STEPS="abc")
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["FAIL  settings   MAX_STEPS must be a whole number, got 'abc'  "
                                        "fix: fix that line in .env (.env.example explains each setting)"]
