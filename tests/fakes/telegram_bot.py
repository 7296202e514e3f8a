"""The real bot, running against the fake Bot API server: the harness of the `test_telegram_*` tests.

    bot = await running_bot(server, tmp_path, [QWEN_LOOKUP, QWEN_FINAL])
    server.send_text(private_chat(ALICE), ALICE, ARTICLE_QUESTION)
    answers = await bot.answers(ALICE.id, 1)
    await bot.stop()

Everything is real but the model: python-telegram-bot's `Application` (built by `bot.telegram.app.build_application`,
talking HTTP to the fake through TELEGRAM_BASE_URL), the SQLite file in `tmp_path`, the tools and the agent; the
model is a `ScriptedLLM` whose requests show what the model saw.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pytest
from telegram.ext import Application

from agent.llm.base import LLM
from agent.llm.scripted import Reply, ScriptedLLM
from bot.program.config import Settings
from bot.telegram.app import build_application, serve
from bot.telegram.intake import journal_source, turn_source_key
from db import Database, open_database
from tests.fakes.telegram_server import Chat, FakeTelegramServer, User, group_chat, private_chat

ADMIN = User(42, "Ada", "en", username="ada")
ALICE = User(1001, "Alice", "zh", username="alice")  # allowed by ALLOWED_USER_IDS
BOB = User(2002, "Bob", "en", username="bob")  # unknown: access closed
CAROL = User(3003, "Carol", "en")  # unknown too, but talks in the allowed group
TEAM = group_chat(-1001000000001, "Team")  # allowed by ALLOWED_CHAT_IDS
STRANGERS = group_chat(-1001000000002, "Strangers")  # not allowed

ARTICLE_QUESTION = "请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？"
QWEN_LOOKUP = ("Thought: 我应该使用课程信息数据库API来查询大模型技术实战课程的课时。\n"
               "Action: course_query\n"
               'Action Input: {"course_name": "大模型技术实战"}\n'
               "Observation:")
QWEN_FINAL = " 我现在知道最终答案了。\nFinal Answer: 大模型技术实战课程目前一共上线了200节课。"


def final(answer: str) -> str:
    """A model reply that answers at once."""
    return f"Thought: I now know the final answer\nFinal Answer: {answer}"


def lookup(course_name: str) -> str:
    """A model reply that looks `course_name` up: a question naming a known course gets that first
    (REQUIRE_TOOL_CALL, on by default)."""
    arguments = json.dumps({"course_name": course_name}, ensure_ascii=False)
    return f"Thought: I should look the course up.\nAction: course_query\nAction Input: {arguments}\nObservation:"


def bot_settings(server: FakeTelegramServer, tmp_path: Path, **overrides: Any) -> Settings:
    """Settings pointing at the fake server and a fresh database; quick feedback timings for tests."""
    base = Settings.of(
        telegram_bot_token=server.token, telegram_base_url=server.base_url,
        database_path=tmp_path / "bot.sqlite3", llm_backend="scripted",
        admin_user_ids=frozenset({ADMIN.id}), allowed_user_ids=frozenset({ALICE.id}),
        allowed_chat_ids=frozenset({TEAM.id}),
        progress_after_seconds=30, typing_interval_seconds=1, shutdown_grace_seconds=0.5,
    )
    return base.replaced(**overrides)


@dataclass
class RunningBot:
    """A bot serving in the background of the test's event loop."""

    server: FakeTelegramServer
    settings: Settings
    llm: ScriptedLLM
    application: Application
    stop_event: asyncio.Event
    task: asyncio.Task

    async def answers(self, chat_id: int, count: int, timeout: float = 5.0) -> list[str]:
        """Wait until the bot has sent `count` messages to `chat_id`; return all its texts there."""
        await self.server.wait_for(lambda: len(self.server.sent_texts(chat_id)) >= count, timeout,
                                   f"{count} message(s) in chat {chat_id}, got {self.server.sent_texts(chat_id)}")
        return self.server.sent_texts(chat_id)

    async def turns_done(self, timeout: float = 10.0) -> None:
        """Wait until no turn waits or runs, and the bot has stopped calling the server."""
        turns = self.application.bot_data["turns"]
        await self.server.wait_for(lambda: not turns.active, timeout, "the turns to finish")
        await self.server.settle()

    async def ask(self, chat: Chat, user: User, text: str, count: int | None = None, **kwargs: Any) -> str:
        """`user` writes `text`; wait for one more message from the bot in `chat`, and return it."""
        before = len(self.server.sent_texts(chat.id))
        self.server.send_text(chat, user, text, **kwargs)
        return (await self.answers(chat.id, before + 1))[before]

    async def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Rows from the bot's database, read through a second connection."""
        db = await open_database(self.settings.storage.database_path)
        try:
            return [tuple(row) for row in await db.fetchall(sql, params)]
        finally:
            await db.close()

    async def all_handled(self, timeout: float = 5.0) -> None:
        """Wait until the journal holds no unhandled update. A turn's slot is released before its update is
        marked handled, so waiting for no active turn is not enough."""
        deadline = asyncio.get_running_loop().time() + timeout
        while (left := await self.query("SELECT update_id FROM telegram_updates WHERE handled_at IS NULL")):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"updates still unhandled: {left}")
            await asyncio.sleep(0.02)

    def source_key(self, update_id: int) -> str:
        """The `source_key` of the turn update `update_id` asks for (the journal's source: this bot at this server)."""
        return turn_source_key(journal_source(self.server.bot.id, self.settings), update_id)

    @property
    def db(self) -> Database:
        """The bot's own database connection (while it runs)."""
        return self.application.bot_data["services"].db

    async def stop(self) -> None:
        """Stop like SIGTERM does, and wait for a clean shutdown."""
        if not self.task.done():
            self.stop_event.set()
        await asyncio.wait_for(asyncio.shield(self.task), 15)


async def running_bot(server: FakeTelegramServer, tmp_path: Path, replies: Sequence[Reply] = (), *,
                      delay: float = 0.0, token_seconds: float = 0.0, llm: LLM | None = None,
                      new_database: bool = False, start_timeout: float = 10.0, **overrides: Any) -> RunningBot:
    """Start the real application against `server`, with a scripted model (streaming its replies piece by piece,
    `token_seconds` apart, when given); returns once it polls. `new_database` as `qwenbot run --new-database`."""
    settings = bot_settings(server, tmp_path, **overrides)
    llm = llm or ScriptedLLM(replies, delay=delay, token_seconds=token_seconds)
    application = build_application(settings, llm=llm, new_database=new_database)
    stop_event = asyncio.Event()
    polls_before = server.polls_started  # polls begun (a cancelled one is never recorded as a call)
    task = asyncio.create_task(serve(application, settings, stop_event, poll_timeout=1))
    bot = RunningBot(server, settings, llm, application, stop_event, task)
    # getUpdates is recorded when it answers: wait for the first long poll to be under way instead.
    await server.wait_for(lambda: task.done() or _ready(server, settings, polls_before), start_timeout,
                          "the bot to start")
    if task.done():
        task.result()  # start-up failed: raise its error here
    return bot


def _ready(server: FakeTelegramServer, settings: Settings, polls_before: int) -> bool:
    if settings.webhook.webhook_url:
        return _listening(settings.webhook.webhook_listen, settings.webhook.webhook_port)
    return server.polls_started > polls_before


def _listening(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.05)
        return sock.connect_ex((host, port)) == 0


@pytest.fixture
def telegram_server():
    """A fake Bot API server for one test."""
    with FakeTelegramServer() as server:
        yield server


@pytest.fixture
async def start_bot(telegram_server: FakeTelegramServer, tmp_path: Path):
    """`await start_bot(replies, delay=..., **settings_overrides)`: the bot, stopped after the test."""
    started: list[RunningBot] = []

    async def start(replies: Sequence[Reply] = (), **kwargs: Any) -> RunningBot:
        bot = await running_bot(telegram_server, tmp_path, replies, **kwargs)
        started.append(bot)
        return bot

    yield start
    for bot in started:
        await bot.stop()


__all__ = ["ADMIN", "ALICE", "ARTICLE_QUESTION", "BOB", "CAROL", "QWEN_FINAL", "QWEN_LOOKUP", "STRANGERS", "TEAM",
           "RunningBot", "final", "private_chat", "running_bot", "start_bot", "telegram_server", "bot_settings"]
