"""Another process holding the database's write lock: turns wait for it, or fail clearly; nothing is corrupted."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time

import pytest

from agent.llm.scripted import ScriptedLLM
from agent.loop import Agent
from agent.memory import Memory, Session
from db import open_database
from tools import build_registry
from tools.settings import ToolSettings

HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO audit_log (action, detail) VALUES ('lock', 'held by another process')")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def hold_lock(path, seconds: float) -> subprocess.Popen:
    """Start another process that holds the write lock for `seconds`; return once it holds it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path), str(seconds)], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


async def agent_on(path, busy_timeout: float) -> Agent:
    db = await open_database(path, busy_timeout_seconds=busy_timeout)
    registry = build_registry(db)
    return Agent(ScriptedLLM(["Thought: 好\nFinal Answer: 你好！"]), registry, ToolSettings(db, registry), Memory(db))


async def test_turn_waits_for_a_lock_held_a_few_seconds(tmp_path):
    path = tmp_path / "bot.sqlite3"
    agent = await agent_on(path, busy_timeout=10)
    holder = hold_lock(path, 2.0)
    started = time.monotonic()
    result = await agent.run(Session(id="lock:1", chat_key="lock"), "你好")
    waited = time.monotonic() - started
    holder.wait(10)
    await agent.memory.db.close()

    assert result.answer == "你好！" and waited >= 1.0  # it really waited for the other process
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*) FROM messages").fetchone() == (2,)
        assert conn.execute("SELECT count(*) FROM audit_log WHERE action = 'lock'").fetchone() == (1,)


async def test_turn_fails_clearly_when_the_lock_outlasts_the_busy_timeout(tmp_path):
    path = tmp_path / "bot.sqlite3"
    agent = await agent_on(path, busy_timeout=0.3)
    holder = hold_lock(path, 3.0)
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        await agent.run(Session(id="lock:1", chat_key="lock"), "你好")
    holder.wait(10)
    # Once the other process lets go, the same database works again and holds no half-written turn.
    agent.llm.add("Thought: 好\nFinal Answer: 又好了")
    result = await agent.run(Session(id="lock:1", chat_key="lock"), "再试")
    await agent.memory.db.close()
    assert result.answer == "又好了"
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT content FROM messages ORDER BY id").fetchall() == [("再试",), ("又好了",)]


async def test_a_writer_cancelled_while_its_transaction_begins_leaves_none_open_for_the_next(tmp_path):
    """Shutdown cancels turns mid-write: a cancelled BEGIN still runs on the database's thread. The next writer
    (the cancelled turn storing its failure) must still get a transaction of its own, and nothing half-done."""
    db = await open_database(tmp_path / "bot.sqlite3")

    async def write(action: str) -> None:
        async with db.transaction() as conn:
            await conn.execute("INSERT INTO audit_log (action) VALUES (?)", (action,))

    cancelled = asyncio.create_task(write("cancelled"))
    await asyncio.sleep(0)  # it is waiting for its BEGIN now
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await write("next")

    rows = await db.fetchall("SELECT action FROM audit_log WHERE action IN ('cancelled', 'next')")
    assert [row[0] for row in rows] == ["next"]
    assert not db.conn.in_transaction
    await db.close()
