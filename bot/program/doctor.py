"""`qwenbot doctor`: check everything the bot needs before it is started, one line per check.

    ok    settings   /srv/bot/.env; LLM_BACKEND=local, AGENT_MODE=react, DATA_DIR=/srv/bot/data
    FAIL  database   no database at /srv/bot/data/bot.sqlite3 yet  fix: run `qwenbot migrate` (scripts/run.sh does)

Each check says what it found; a failed one also says what to do. The exit status is 0 when every check passed
and 1 otherwise. Nothing is changed: the database is opened read-only, model weights are not loaded (the config
and tokenizer are), and the model server gets one request of one token.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import sqlite3
import stat
import sys
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Awaitable, Callable, TextIO

from agent.errors import LLMError, ModelLoadError
from agent.llm.base import ModelRequest
from bot.program.config import ConfigError, Settings
from bot.program.logs import configure_logging
from bot.program.paths import dotenv_file
from core.secrets import redact
from db.files import make_private_folders
from db.instance_lock import lock_path, serving_pid
from db.marker import marker_path
from db.migrate import MIGRATIONS_FOLDER, discover
from tools.calculator import CALCULATOR

PROBE = [{"role": "user", "content": "Say OK."}]  # the one-token request sent to a model server


class Status(StrEnum):
    """How a check ended."""

    OK = "ok"
    FAIL = "FAIL"
    SKIP = "skip"  # could not run because an earlier check failed


@dataclass(frozen=True)
class Check:
    """One line of the report: what was checked, what was found, and what to do about a failure."""

    name: str
    status: Status
    found: str
    fix: str = ""

    def line(self) -> str:
        """The report line."""
        fix = f"  fix: {self.fix}" if self.status is Status.FAIL and self.fix else ""
        return f"{self.status.value:<5} {self.name:<10} {self.found}{fix}"


def ok(name: str, found: str) -> Check:
    """A passed check."""
    return Check(name, Status.OK, found)


def fail(name: str, found: str, fix: str) -> Check:
    """A failed check, with what to do."""
    return Check(name, Status.FAIL, found, fix)


# --- the checks ------------------------------------------------------------------------------------------------

def check_settings(settings: Settings) -> Check:
    """Settings parsed (a bad one never gets here: see `doctor_main`); say where they came from."""
    source = dotenv_file()
    origin = str(source) if source.is_file() else "no .env file (environment and defaults)"
    return ok("settings", f"{origin}; LLM_BACKEND={settings.model.llm_backend}, "
                          f"AGENT_MODE={settings.agent.agent_mode}, DATA_DIR={settings.storage.data_dir}")


def check_data_dir(settings: Settings) -> Check:
    """The data directory exists (or can be made) and this user can write in it."""
    try:
        make_private_folders(settings.storage.data_dir)  # 0700, as the database would make it
        with tempfile.NamedTemporaryFile(dir=settings.storage.data_dir, prefix=".doctor-"):
            pass
    except OSError as error:
        return fail("data dir", f"{settings.storage.data_dir} is not writable: {error.strerror or error}",
                    "set DATA_DIR to a folder this user can write, or fix its owner and permissions")
    return ok("data dir", f"{settings.storage.data_dir} (writable)")


def check_disk(settings: Settings) -> Check:
    """Enough free space where the data lives (database, model cache)."""
    where = settings.storage.data_dir if settings.storage.data_dir.exists() else Path(settings.storage.data_dir.anchor)
    free_mb = shutil.disk_usage(where).free // 2**20
    found = f"{free_mb / 1024:.1f} GB free in {where}"
    if free_mb < settings.doctor.doctor_min_free_disk_mb:
        return fail("disk", f"{found}, less than DOCTOR_MIN_FREE_DISK_MB={settings.doctor.doctor_min_free_disk_mb}",
                    "free some space or point DATA_DIR at a bigger disk (a hub model needs its size: docs/models.md)")
    return ok("disk", found)


def check_database(settings: Settings) -> Check:
    """The database exists, is the bot's, has every migration, and takes a write."""
    path = settings.storage.database_path
    if not path.is_file() and marker_path(path).is_file():
        return fail("database", f"{path} is missing, but {marker_path(path).name} shows one was created there",
                    "put the file back or restore a backup; `qwenbot migrate --new-database` starts an empty one")
    if not path.is_file():
        return fail("database", f"no database at {path} yet", "run `qwenbot migrate` (scripts/run.sh does)")
    try:
        applied = applied_migrations(path)
        take_write_lock(path)
    except sqlite3.Error as error:
        return database_error(path, error)
    shipped = [migration.name for migration in discover(MIGRATIONS_FOLDER)]
    if missing := [name for name in shipped if name not in applied]:
        return fail("database", f"{path}: {len(missing)} migration(s) not applied ({', '.join(missing)})",
                    "run `qwenbot migrate`")
    if unknown := sorted(applied - set(shipped)):
        return fail("database", f"{path} has migrations this code does not know ({', '.join(unknown)})",
                    "update the code (git pull) or point DATABASE_PATH at this version's database")
    return ok("database", f"{path} (migrated, {len(shipped)} migrations; writable)")


def check_instance(settings: Settings) -> Check:
    """No other qwenbot serves the database: `qwenbot run` would wait for it to stop, then give up."""
    try:
        pid = serving_pid(settings.storage.database_path)
    except OSError as error:
        return fail("instance", f"cannot read {lock_path(settings.storage.database_path)}: {error.strerror or error}",
                    "let this user read the lock file beside the database (owner, permissions)")
    if pid is None:
        return ok("instance", "no qwenbot serves this database now")
    return fail("instance", f"another qwenbot (pid {pid}) serves {settings.storage.database_path}",
                f"stop it before starting another: `qwenbot run` waits INSTANCE_LOCK_WAIT_SECONDS="
                f"{settings.storage.instance_lock_wait_seconds:g} for it, then gives up (a doctor run beside a live "
                "bot may ignore this line)")


def applied_migrations(path: Path) -> set[str]:
    """The migration names recorded in the database, read without changing it."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "schema_migrations" not in tables:
            return set()
        return {row[0] for row in conn.execute("SELECT name FROM schema_migrations")}


def take_write_lock(path: Path) -> None:
    """Begin and roll back a write: fails when the file is read-only or another process holds the lock."""
    conn = sqlite3.connect(path, timeout=1.0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def database_error(path: Path, error: sqlite3.Error) -> Check:
    """A failed database check, with the fix for what SQLite said. A file that cannot be written, or sits in a folder
    that cannot be, is said to be so: moving a good database away would only lose it."""
    text = str(error)
    if (unwritable := why_unwritable(path)) is not None:
        return fail("database", f"{path}: {text}: {unwritable.found}", unwritable.fix)
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF
    if "locked" in text or "busy" in text:
        fix = "another process holds the database's write lock: is another qwenbot running? stop it first"
    elif code == sqlite3.SQLITE_NOTADB:
        fix = "DATABASE_PATH must name the bot's SQLite file: move this file away and run `qwenbot migrate`"
    elif code == sqlite3.SQLITE_CORRUPT:
        fix = "the file is damaged: restore the last backup with `qwenbot restore PATH` (docs/operations.md)"
    else:
        fix = "see what SQLite said above; `qwenbot doctor` again once it is dealt with"
    return fail("database", f"{path}: {text}", fix)


@dataclass(frozen=True)
class Unwritable:
    """Why a path cannot be written, and what to change."""

    found: str
    fix: str


def why_unwritable(path: Path) -> Unwritable | None:
    """Whether the database file or its folder refuses writes (SQLite creates `-wal` and `-shm` beside the file), and
    why; None when both take a write. Tried for real, as root is not bound by permission bits."""
    folder = path.parent
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".doctor-"):
            pass
    except OSError as error:
        return unwritable(folder, error, f"SQLite must create {path.name}-wal and {path.name}-shm in it")
    try:
        os.close(os.open(path, os.O_RDWR))
    except OSError as error:
        return unwritable(path, error, "the database file itself")
    return None


def unwritable(where: Path, error: OSError, role: str) -> Unwritable:
    """What a refused write to `where` means, by its errno, and what to change (the database stays where it is)."""
    if error.errno == errno.EROFS:
        return Unwritable(f"{where} is on a read-only mount ({mount_point(where)}; {role})",
                          "remount it read-write (a container: mount the data volume without :ro); the database "
                          "itself needs no change")
    if error.errno == errno.EACCES:
        owner = owner_and_mode(where)
        return Unwritable(f"this user (uid {os.geteuid()}) may not write {where} ({owner}; {role})",
                          f"give this user write access to {where} (chown to the user the bot runs as, or chmod "
                          f"u+w), or run the bot as its owner")
    if error.errno == errno.EPERM:
        return Unwritable(f"{where} refuses writes even to its owner ({role}): an immutable or append-only "
                          f"attribute (`lsattr -d {where}` shows i or a)", f"remove it: chattr -i -a {where}")
    return Unwritable(f"{where} cannot be written: {error.strerror or error} ({role})",
                      f"make {where} writable for this user (owner, permissions, mount options)")


def owner_and_mode(where: Path) -> str:
    try:
        status = where.stat()
    except OSError:
        return "owner unknown"
    return f"owner uid {status.st_uid}, mode {stat.S_IMODE(status.st_mode):04o}"


def mount_point(where: Path) -> Path:
    """The mount point of the filesystem holding `where`."""
    where = where.resolve()
    while where != where.parent and os.path.ismount(where) is False:
        where = where.parent
    return where


def check_vocabulary(settings: Settings) -> Check:
    """Qwen's tiktoken vocabulary, which counts tokens when the model is not local."""
    path = settings.model.tokenizer_vocab_path
    if path.is_file():
        return ok("vocab", f"{path}")
    if settings.model.llm_backend == "local":
        return ok("vocab", f"{path} absent (not needed: the local model counts its own tokens)")
    return fail("vocab", f"{path} absent: token counts would be estimates",
                "run scripts/fetch_assets.sh, or set TOKENIZER_VOCAB_PATH")


async def check_telegram(settings: Settings) -> list[Check]:
    """The Bot API answers at TELEGRAM_BASE_URL, and accepts the token (getMe)."""
    from telegram import Bot
    from telegram.error import InvalidToken, NetworkError
    from telegram.request import HTTPXRequest

    url = settings.telegram.telegram_base_url
    if not settings.telegram.telegram_bot_token:
        return [Check("bot api", Status.SKIP, f"{url}: not tried without a token"),
                fail("token", "TELEGRAM_BOT_TOKEN is not set",
                     "create a bot with @BotFather and put its token in .env (docs/telegram.md: Create the bot)")]
    timeout = settings.doctor.doctor_timeout_seconds
    request = HTTPXRequest(connect_timeout=timeout, read_timeout=timeout, write_timeout=timeout)
    bot = Bot(settings.telegram.telegram_bot_token, base_url=url, request=request)
    try:
        async with bot:  # initialize() calls getMe
            me = bot.bot
    except InvalidToken:
        return [ok("bot api", f"{url} answers"),
                fail("token", "the Bot API refused TELEGRAM_BOT_TOKEN",
                     "copy the token again from @BotFather (/mybots, API Token) into .env")]
    except NetworkError as error:
        return [fail("bot api", f"cannot reach {url}: {error.message}",
                     "check TELEGRAM_BASE_URL and the network (a local Bot API server must be running)"),
                Check("token", Status.SKIP, "not checked: the Bot API did not answer")]
    return [ok("bot api", f"{url} answers"), ok("token", f"accepted: @{me.username} (id {me.id})")]


async def check_model(settings: Settings) -> list[Check]:
    """The model the settings choose: loadable (local) or served (openai), its chat template, tools if native."""
    if settings.model.llm_backend == "openai":
        return await check_model_server(settings)
    if settings.model.llm_backend == "local":
        return await asyncio.to_thread(check_local_model, settings)
    path = Path(settings.scripted.scripted_replies_path)
    if not path.is_file():
        return [fail("model", f"SCRIPTED_REPLIES_PATH {settings.scripted.scripted_replies_path!r} is no file",
                     "point SCRIPTED_REPLIES_PATH at a JSON list of replies, or choose LLM_BACKEND=local/openai")]
    return [ok("model", f"scripted replies from {path}")]


def check_local_model(settings: Settings) -> list[Check]:
    """Find MODEL, load its config and tokenizer (not the weights), render a chat, and tools in native mode."""
    from agent.llm.engine.loading import load_options, resolve_model

    try:
        source = resolve_model(settings.model.model, settings.storage.data_dir)
        options = load_options(source, settings.model.model_cache_dir)
        config, tokenizer = load_config_and_tokenizer(source.location, options)
    except ModelLoadError as error:
        return [fail("model", str(error), MODEL_FIX)]
    checks = [ok("model", f"{settings.model.model} loads ({describe_source(source, options)})"),
              memory_line(settings, config)]
    if not getattr(tokenizer, "chat_template", None):
        return checks + [fail("template", "the tokenizer has no chat template (a base model?)",
                              "use an instruct/chat model, e.g. Qwen/Qwen2.5-1.5B-Instruct")]
    checks.append(ok("template", "chat template renders"
                     if tokenizer.apply_chat_template(PROBE, tokenize=False) else "chat template is empty"))
    if settings.agent.agent_mode == "native":
        checks.append(check_native_template(tokenizer))
    return checks


MODEL_FIX = "check MODEL (docs/models.md: Choosing a model and hardware)"


def memory_line(settings: Settings, config: Any) -> Check:
    """The memory the engine is expected to hold with this model, dtype, batch and prefix store (engine/memory.py),
    against what the machine has available."""
    from agent.llm.engine.loading import resolved_mode
    from agent.llm.engine.memory import plan

    mode, float_bytes = resolved_mode(settings.model.model_dtype, on_gpu=False, config=config)
    try:
        expected = plan(config, mode, float_bytes=float_bytes, batch_size=settings.engine.batch_size,
                        prefix_cache_mb=settings.engine.prefix_cache_megabytes())
    except AttributeError as error:  # a config without the usual sizes: say so, do not guess
        return ok("memory", f"no estimate for this model's config ({error})")
    found = f"MODEL_DTYPE={settings.model.model_dtype} ({mode}), BATCH_SIZE={settings.engine.batch_size}: " \
            f"{expected.line()}"
    available = available_memory()
    if available is not None and expected.total > available:
        return fail("memory", f"{found}; only {available >> 20} MiB available",
                    "a smaller model, MODEL_DTYPE=int4 or int8, a smaller BATCH_SIZE or PREFIX_CACHE_MB "
                    "(docs/models.md)")
    return ok("memory", found)


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes of memory available to a new process (Linux's MemAvailable), or None where unknown."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        return None
    return None


def load_config_and_tokenizer(location: str, options: dict[str, Any]) -> tuple[Any, Any]:
    """The model's config and tokenizer, loaded as start-up would load them; errors as `ModelLoadError`."""
    from transformers import AutoConfig, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(location, **options)
        return config, AutoTokenizer.from_pretrained(location, **options)
    except Exception as error:
        first = (str(error).strip() or type(error).__name__).splitlines()[0]
        raise ModelLoadError(f"MODEL {location}: cannot load it: {first}") from error


def describe_source(source: Any, options: dict[str, Any]) -> str:
    """Where the model comes from, in words."""
    if source.gguf_file:
        return f"GGUF file in {source.location}"
    if not source.hub:
        return f"folder {source.location}"
    if options.get("local_files_only"):
        return f"hub id, cached in {options.get('cache_dir')}"
    return f"hub id, downloaded to {options.get('cache_dir')} at first start"


def check_native_template(tokenizer: Any) -> Check:
    """AGENT_MODE=native needs a chat template that shows the model its tools."""
    rendered = tokenizer.apply_chat_template(PROBE, tools=[CALCULATOR.openai_spec()], tokenize=False)
    if CALCULATOR.name not in rendered:
        return fail("tools", "the chat template ignores tools, so native tool calls cannot work",
                    "use AGENT_MODE=react, or a model whose template takes tools (Qwen2.5, Qwen3)")
    return ok("tools", "the chat template renders tools (native mode)")


async def check_model_server(settings: Settings) -> list[Check]:
    """The server answers, serves the model, completes one token, and takes tools in native mode."""
    from bot.program.services import build_llm

    llm = build_llm(settings)
    try:
        served = await llm.served_models()
        if served and llm.model not in served:
            return [fail("model", f"the server at {llm.url} serves {', '.join(served)}, not {llm.model}",
                         f"set OPENAI_MODEL to one of them (OPENAI_MODEL={served[0]})")]
        checks = [ok("model", f"{llm.model} on the server at {llm.url}")]
        checks.append(await server_call("chat", llm, tools=None))
        if settings.agent.agent_mode == "native" and checks[-1].status is Status.OK:
            checks.append(await server_call("tools", llm, tools=[CALCULATOR.openai_spec()]))
        return checks
    except LLMError as error:
        return [fail("model", str(error), "start the model server, or fix OPENAI_BASE_URL / OPENAI_API_KEY "
                                          "(docs/models.md: Model servers)")]
    finally:
        await llm.close()


async def server_call(name: str, llm: Any, tools: list[dict[str, Any]] | None) -> Check:
    """One request of one token: the server applies its chat template (and, with `tools`, its tool parser)."""
    try:
        await llm.complete(ModelRequest(PROBE, max_new_tokens=1, tools=tools))
    except LLMError as error:
        fix = ("start the server with tool calling on (vLLM: --enable-auto-tool-choice --tool-call-parser hermes; "
               "llama.cpp: --jinja), or use AGENT_MODE=react") if tools else "see the server's log"
        return fail(name, str(error), fix)
    return ok(name, "the server answers a chat request" + (" with tools" if tools else ""))


# --- running ---------------------------------------------------------------------------------------------------

CHECKS: list[Callable[[Settings], Check | list[Check] | Awaitable[Check | list[Check]]]] = [
    check_settings, check_data_dir, check_disk, check_database, check_instance, check_vocabulary, check_telegram, check_model,
]


async def diagnose(settings: Settings) -> list[Check]:
    """Run every check, in order."""
    results: list[Check] = []
    for check in CHECKS:
        outcome = check(settings)
        if asyncio.iscoroutine(outcome):
            outcome = await outcome
        results.extend(outcome if isinstance(outcome, list) else [outcome])
    return results


def report(checks: list[Check], out: TextIO) -> int:
    """Print a line per check; 0 when all passed, 1 otherwise."""
    for check in checks:
        print(redact(check.line()), file=out, flush=True)  # a token pasted into a URL setting, say
    return 0 if all(check.status is Status.OK for check in checks) else 1


def doctor_main(out: TextIO = sys.stdout) -> int:
    """`qwenbot doctor`: read the settings as `qwenbot run` would, check everything, report."""
    try:
        settings = Settings.from_env()
    except ConfigError as error:
        return report([fail("settings", str(error), "fix that line in .env (.env.example explains each setting)")],
                      out)
    # The report is the output: library log lines (hub, transformers) would only interleave with it.
    configure_logging("ERROR", secrets=settings.secrets())  # also what `report` redacts
    return report(asyncio.run(diagnose(settings)), out)
