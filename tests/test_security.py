"""Security checks: admin commands for admins only, the bot token in no log line or message, no tool that changes
data offered to the model, SQL that treats every user text as data, and `.env` kept out of git.

Asserted elsewhere and not repeated: strangers get their id and nothing else (test_telegram_private.py), a group
that is not allowed (test_telegram_groups.py), webhook updates with a wrong secret refused (test_telegram_intake.py),
credentials in OPENAI_BASE_URL kept out of messages (test_openai_backend.py), names with SQL in the course catalogue
(test_courses.py), and every bad input through the running bot (test_bad_input.py).
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from telegram.ext import CommandHandler

from agent.memory import Memory, Session, TurnRecord
from agent.prompts import react_prompt
from agent.steps import TurnResult
from bot.program.audit import audit
from bot.program.logs import REDACTED, configure_logging
from bot.program.texts import language
from bot.telegram.i18n import text
from db import Database
from tests.fakes.telegram_bot import ADMIN, ALICE, BOB, CAROL, TEAM, final, private_chat, running_bot
from tests.fakes.telegram_server import FakeTelegramServer, User
from tests.test_bad_input import SEED_COURSES, start_shared_bot, stop_shared_bot
from tools import build_registry
from tools.settings import GLOBAL, ToolSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")

ROOT = Path(__file__).resolve().parent.parent
# Shaped like a real token (digits, a colon, 35 characters), so the shape-based redaction is exercised too.
REAL_LOOKING_TOKEN = "7212345678:AAHq3xZk9V_secret-part-of-the-token-x"
INJECTIONS = ["'; DROP TABLE courses;--", "x' OR '1'='1", "1); DELETE FROM access_list;--", '" OR ""="',
              "%' UNION SELECT name FROM sqlite_master --"]
# An example of each admin command, as an admin would send it. A new admin command must be added here.
ADMIN_EXAMPLES = {
    "tool_on": "/tool_on calculator", "tool_off": "/tool_off course_query global", "tools all": "/tools all",
    "courses": "/courses", "course_add": "/course_add 强化学习实战 120 2 1.5",
    "course_set": "/course_set 大模型技术实战 lessons 0", "course_del": "/course_del 大模型技术实战",
    "allow": f"/allow {BOB.id}", "deny": f"/deny {ALICE.id}", "admins": "/admins", "stats": "/stats 30",
    "mcp_add": '/mcp_add wiki http://127.0.0.1:9/mcp "Authorization=Bearer x"', "mcp_list": "/mcp_list",
    "mcp_del": "/mcp_del wiki", "mcp_refresh": "/mcp_refresh wiki",
    "require_tool": "/require_tool on",
    "docs all": "/docs all", "doc_add": "/doc_add global", "doc_del": "/doc_del 1", "doc_scope": "/doc_scope 1 global",
    "persona": "/persona You are Ada, a patient tutor.", "quota_set": f"/quota_set {ALICE.id} turns 5",
}
ANONYMOUS_ADMIN = User(1087968824, "Group", username="GroupAnonymousBot", is_bot=True)  # Telegram's stand-in


def refused(user: User) -> str:
    """The admins-only line, in the sender's Telegram language (as every admin reply is)."""
    return text("admins_only", language(user.language_code))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory):
    """One running bot for the module's Telegram checks."""
    server, bot = await start_shared_bot(tmp_path_factory.mktemp("security"))
    yield bot
    await stop_shared_bot(server, bot)


# --- admin commands ------------------------------------------------------------------------------------------

def admin_commands(application: Any) -> set[str]:
    """Every command whose handler lives in bot/telegram/admin.py or bot/admin_*.py, as registered (`tools all` for the
    /tools variant)."""
    found = set()
    for handler in application.handlers[0]:
        if isinstance(handler, CommandHandler) and handler.callback.__module__.startswith("bot.telegram.admin"):
            suffix = " all" if "all" in str(handler.filters) else ""
            found |= {command + suffix for command in handler.commands}
    return found


async def test_every_registered_admin_command_is_checked_here(shared):
    assert admin_commands(shared.bot.application) == set(ADMIN_EXAMPLES)


SENDERS = {
    "allowed-user": (private_chat(ALICE), ALICE, {}),
    "stranger": (private_chat(BOB), BOB, {}),
    "member-of-an-allowed-group": (TEAM, CAROL, {}),
    "anonymous-group-admin": (TEAM, ANONYMOUS_ADMIN, {"sender_chat": TEAM.as_dict()}),
}


@pytest.mark.parametrize("sender", list(SENDERS))
@pytest.mark.parametrize("command", list(ADMIN_EXAMPLES))
async def test_admin_commands_are_refused_to_everyone_else_and_change_nothing(shared, command, sender):
    chat, user, extra = SENDERS[sender]
    outcome = await shared.send(chat, user, text=ADMIN_EXAMPLES[command], **extra)
    if sender == "stranger":  # no access at all: the refusal any message of theirs gets (once per
        # REFUSAL_INTERVAL_SECONDS, with their id), never word of the admin commands (issue 43)
        assert outcome.replies in ([], [text('not_allowed', 'en', user_id=BOB.id)])
    else:
        assert outcome.reply == refused(user)
    assert outcome.changed() == set() and outcome.added("audit_log") == []


async def test_the_same_commands_from_an_admin_do_change_data_and_are_audited(shared):
    # The control for the test above: the snapshot sees a change when there is one.
    steps = [("/course_add 安全测试课 1 1 1", "course_add"), ("/course_set 安全测试课 lessons 2", "course_set"),
             ("/course_del 安全测试课", "course_del"), ("/tool_off calculator", "tool_off"),
             ("/tool_on calculator", "tool_on"), (f"/allow {BOB.id}", "allow"), (f"/deny {BOB.id}", "deny")]
    for command, action in steps:
        outcome = await shared.send(private_chat(ADMIN), ADMIN, text=command)
        assert outcome.reply.startswith("✅"), outcome.reply
        assert [row[2] for row in outcome.added("audit_log")] == [action]
    assert outcome.after["courses"] == SEED_COURSES


async def test_allow_gives_access_never_admin_rights(shared):
    await shared.send(private_chat(ADMIN), ADMIN, text=f"/allow {BOB.id}")
    outcome = await shared.send(private_chat(BOB), BOB, text="/course_del 大模型技术实战")
    assert outcome.reply == refused(BOB) and outcome.changed() == set()
    await shared.send(private_chat(ADMIN), ADMIN, text=f"/deny {BOB.id}")


async def test_a_webhook_without_a_configured_secret_gets_a_random_one_and_refuses_posts_without_it(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/hook"
    with FakeTelegramServer() as server:
        bot = await running_bot(server, tmp_path, webhook_url=url, webhook_port=port)
        try:
            secret = server.calls_to("setWebhook", ok=True)[0].params["secret_token"]
            update = {"update_id": 1, "message": {"message_id": 1, "date": 0, "chat": private_chat(ALICE).as_dict(),
                                                  "from": ALICE.as_dict(), "text": "/course_del 大模型技术实战"}}
            async with httpx.AsyncClient() as client:
                refused = [await client.post(url, json=update, headers=headers) for headers in
                           ({}, {"X-Telegram-Bot-Api-Secret-Token": ""}, {"X-Telegram-Bot-Api-Secret-Token": "x"})]
        finally:
            await bot.stop()
    assert len(secret) >= 32
    assert [r.status_code for r in refused] == [403, 403, 403]
    assert server.sent() == []


# --- the bot token -------------------------------------------------------------------------------------------

async def test_no_message_the_bot_sent_in_this_module_holds_a_secret(shared):
    token = shared.bot.settings.telegram.telegram_bot_token
    texts = [str(c.params.get("text", "")) for c in shared.server.calls if "text" in c.params]
    assert texts and not [t for t in texts if token in t or token.split(":")[1] in t]


def token_variants(token: str) -> list[str]:
    """The token, its secret half, and the token as it would look URL-encoded."""
    return [token, token.split(":", 1)[1], token.replace(":", "%3A")]


def run_qwenbot(server: FakeTelegramServer, tmp_path: Path) -> subprocess.Popen:
    """`qwenbot run` as a process against `server`, logging at DEBUG, with one scripted answer.

    Its output goes to files (`tmp_path/stdout`, `tmp_path/stderr`): a DEBUG log fills a pipe nobody reads yet
    within a second, and the process would then block on its next log line.
    """
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps([final("first answer")]), encoding="utf-8")
    env = {**os.environ, "TELEGRAM_BOT_TOKEN": server.token, "TELEGRAM_BASE_URL": server.base_url,
           "LLM_BACKEND": "scripted", "SCRIPTED_REPLIES_PATH": str(replies), "LOG_LEVEL": "DEBUG",
           "DATABASE_PATH": str(tmp_path / "run.sqlite3"), "ALLOWED_USER_IDS": str(ALICE.id),
           "TOKENIZER_VOCAB_PATH": str(tmp_path / "absent.tiktoken"), "PYTHONPATH": str(ROOT)}
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        return subprocess.Popen([sys.executable, "-m", "bot.program.cli", "run"], cwd=tmp_path, env=env,
                                stdout=stdout, stderr=stderr)


async def test_the_token_never_reaches_the_log_of_a_real_run_even_in_error_messages(tmp_path):
    with FakeTelegramServer(token=REAL_LOOKING_TOKEN) as server:
        # Failures whose descriptions carry the token, as a misbehaving proxy might echo the URL.
        server.fail("getUpdates", status=502, description=f"Bad Gateway for /bot{server.token}/getUpdates", times=2)
        server.fail("sendMessage", status=400, description=f"Bad Request: no route /bot{server.token}",
                    when=lambda params: params.get("text") == "first answer")
        server.fail("setMyCommands", status=400, description=f"Bad Request: {server.token}", times=-1)
        process = run_qwenbot(server, tmp_path)
        try:
            server.send_text(private_chat(ALICE), ALICE, "first: the answer cannot be sent")
            await server.wait_for(lambda: server.sent_texts(ALICE.id), 30, "the apology for the first question")
            server.send_text(private_chat(ALICE), ALICE, "second: the model has nothing left to say")
            await server.wait_for(lambda: len(server.sent_texts(ALICE.id)) == 2, 30, "an apology for each question")
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=20)
            stdout, stderr = ((tmp_path / name).read_text(encoding="utf-8") for name in ("stdout", "stderr"))
        finally:
            process.kill()
    assert process.returncode == 0, stderr
    assert server.sent_texts(ALICE.id) == ["抱歉，出了点问题，请稍后再试。", "抱歉，模型暂时无法回答，请稍后再试。"]
    # The failures were logged (the test would prove nothing otherwise), and redacted.
    assert "getting updates failed" in stderr and "handling update" in stderr and "model failed" in stderr
    assert "Traceback" in stderr and REDACTED in stderr
    for secret in token_variants(server.token):
        assert secret not in stderr and secret not in stdout, secret


@pytest.fixture
def restored_logging():
    """Put the root logger back as it was after a test that calls configure_logging."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    levels = {name: logging.getLogger(name).level for name in ("httpx", "httpcore")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, value in levels.items():
        logging.getLogger(name).setLevel(value)


async def test_configure_logging_redacts_secrets_from_every_logger_and_traceback(restored_logging, monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)  # basicConfig writes to the stderr of the moment
    api_key = "sk-another-secret-api-key"
    configure_logging("DEBUG", secrets=[REAL_LOOKING_TOKEN, api_key])
    logging.getLogger("httpx").setLevel(logging.DEBUG)  # as an operator chasing a bug might

    with FakeTelegramServer(token=REAL_LOOKING_TOKEN) as server:
        async with httpx.AsyncClient() as client:
            await client.get(f"{server.base_url}{server.token}/getMe")  # httpx logs the URL, token and all
    log = logging.getLogger("bot.test")
    log.error("calling with %s and key %s", REAL_LOOKING_TOKEN, api_key)
    try:
        raise RuntimeError(f"request to https://api.telegram.org/bot{REAL_LOOKING_TOKEN}/getMe failed")
    except RuntimeError:
        log.exception("a failure")
    log.warning("a token of another bot: 1234567890:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")

    output = stream.getvalue()
    assert "HTTP Request" in output and "a failure" in output and "Traceback" in output
    assert output.count(REDACTED) >= 5
    for secret in [*token_variants(REAL_LOOKING_TOKEN), api_key, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"]:
        assert secret not in output, secret


# --- no tool that changes data -----------------------------------------------------------------------------------

SAMPLE_STRINGS = ["大模型技术实战", "1 + 1", "AI", *INJECTIONS]
WRITE_WORDS = re.compile(r"add|set|del|remove|update|insert|drop|write|create|allow|deny|tool_o", re.IGNORECASE)


def dump(path: Path) -> list[str]:
    """Every row and every schema statement of the database file."""
    with sqlite3.connect(path) as conn:
        return list(conn.iterdump())


def sample_arguments(tool: Any) -> list[dict[str, Any]]:
    """Valid arguments for `tool`, from its schema: each sample value for each parameter, with the other required
    parameters given their first sample (an array parameter: a list of one of its items' values)."""
    properties = tool.parameters.get("properties", {})
    if not properties:
        return [{}]
    typed = {"integer": [0, 1], "number": [0.5], "boolean": [True, False]}

    def values(spec: dict[str, Any]) -> list[Any]:
        if spec.get("type") == "array":
            return [[item] for item in spec.get("items", {}).get("enum", [])[:1]] or [[]]
        return SAMPLE_STRINGS if spec.get("type") == "string" else typed.get(spec.get("type"), [None])

    required = {name: values(properties[name])[0] for name in tool.parameters.get("required", ())}
    samples = []
    for name, spec in properties.items():
        samples += [{**required, name: value} for value in values(spec)]
    return samples


async def test_every_tool_the_model_can_call_leaves_the_database_as_it_was(db: Database, db_path: Path):
    registry = build_registry(db)
    before = dump(db_path)
    calls = 0
    for tool in registry:
        for arguments in sample_arguments(tool):
            result = await registry.call(tool.name, arguments)
            assert result.error in (None, "tool_error"), (tool.name, arguments, result.output)
            calls += 1
    assert calls >= len(SAMPLE_STRINGS) * 2 and dump(db_path) == before


async def test_no_tool_is_named_or_described_as_a_change_and_admin_commands_are_unknown_to_the_model(db, db_path):
    registry = build_registry(db)
    for tool in registry:
        assert not WRITE_WORDS.search(tool.name), tool.name
        assert not re.search(r"\b(add|change|delete|remove|update)s?\b", tool.description, re.IGNORECASE)
    offered = react_prompt(list(registry), "question") + json.dumps([t.openai_spec() for t in registry])
    for command in ("course_add", "course_set", "course_del", "tool_on", "tool_off", "allow", "deny"):
        assert command not in offered
        assert (await registry.call(command, {"name": "大模型技术实战"})).error == "unknown_tool"
    before = dump(db_path)
    assert (await registry.call("course_query", {"course_name": "x", "sql": "DROP TABLE courses"})).error == \
        "invalid_arguments"
    assert dump(db_path) == before


async def test_a_chat_can_only_enable_tools_from_the_registry(db):
    registry = build_registry(db)
    settings = ToolSettings(db, registry)
    with pytest.raises(KeyError):
        await settings.set_enabled("course_add", True, GLOBAL)
    assert {t.name for t in await settings.enabled_tools("tg:1")} <= set(registry.names)


# --- SQL takes user text as data only ----------------------------------------------------------------------------

def schema(path: Path) -> list[tuple]:
    """The tables, indexes and triggers of the database file."""
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def count(path: Path, table: str) -> int:
    """Rows in `table`."""
    with sqlite3.connect(path) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


@pytest.mark.parametrize("text", INJECTIONS)
async def test_tool_settings_store_an_injected_scope_literally(db, db_path, text):
    settings = ToolSettings(db, build_registry(db))
    tables = schema(db_path)
    await settings.set_enabled("calculator", False, scope=text)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT scope, tool_name, enabled FROM tool_settings").fetchall() == \
            [(text, "calculator", 0)]
    assert "calculator" not in {t.name for t in await settings.enabled_tools(text)}
    assert "calculator" in {t.name for t in await settings.enabled_tools(GLOBAL)}
    assert schema(db_path) == tables and count(db_path, "courses") == 4


@pytest.mark.parametrize("text", INJECTIONS)
async def test_history_and_traces_store_injected_text_literally_and_reset_only_their_session(db, db_path, text):
    memory = Memory(db)
    tables = schema(db_path)
    for session_id, question in (("tg:1", "a harmless question"), (text, text)):
        result = TurnResult(answer=text, steps=[], status="answered")
        await memory.save_turn(Session(session_id, session_id), TurnRecord(question, result, "2026-01-01T00:00:00Z",
                                                                           source_key=text + session_id))
    assert [tuple(r) for r in await db.fetchall("SELECT session_id, content FROM messages WHERE session_id = ?",
                                                (text,))] == [(text, text), (text, text)]
    await memory.reset(text)
    assert count(db_path, "messages") == 2 and count(db_path, "turns") == 2  # the other session is whole
    assert schema(db_path) == tables and count(db_path, "courses") == 4


@pytest.mark.parametrize("text", INJECTIONS)
async def test_audit_details_are_stored_literally(db, db_path, text):
    await audit(db, 42, -1, text, text)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT action, detail FROM audit_log").fetchall() == [(text, text)]
    assert count(db_path, "courses") == 4 and count(db_path, "access_list") == 0


@pytest.mark.parametrize("text", INJECTIONS)
async def test_injection_through_telegram_is_stored_as_a_question_and_a_course_name(shared, text):
    asked = await shared.send(private_chat(ALICE), ALICE, text=text, model=[final("noted")])
    assert asked.added("messages") == [(f"tg:{ALICE.id}", "user", text), (f"tg:{ALICE.id}", "assistant", "noted")]
    name = f"课 {text}"
    added = await shared.send(private_chat(ADMIN), ADMIN, text=f"/course_add {name} 1 1 1")
    assert added.after["courses"][-1] == (name, 1, 1, 1.0)
    removed = await shared.send(private_chat(ADMIN), ADMIN, text=f"/course_del {name}")
    assert removed.reply == f"✅ Removed {name}."
    assert removed.after["courses"] == SEED_COURSES and removed.after["schema"] == asked.before["schema"]


# --- secrets on disk ---------------------------------------------------------------------------------------------

def git(*args: str) -> subprocess.CompletedProcess:
    """A git command in the repository."""
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


@pytest.fixture
def repository():
    """Skip where the tests run outside a git work tree (an unpacked archive)."""
    if shutil.which("git") is None or git("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        pytest.skip("not a git work tree")


@pytest.mark.parametrize("path", [".env", "data/bot.sqlite3", "bot.sqlite3-wal", "data/qwen.tiktoken"])
async def test_secrets_and_data_are_ignored_by_git(repository, path):
    assert git("check-ignore", "-q", path).returncode == 0, f"{path} is not ignored"
    assert git("ls-files", path).stdout == ""


async def test_the_example_settings_hold_no_token_or_key():
    example = (ROOT / ".env.example").read_text(encoding="utf-8")
    assert re.search(r"^TELEGRAM_BOT_TOKEN=\s*$", example, re.MULTILINE)
    assert re.search(r"^OPENAI_API_KEY=(EMPTY)?\s*$", example, re.MULTILINE)
    assert not re.search(r"\d{6,12}:[A-Za-z0-9_-]{30,}", example)
