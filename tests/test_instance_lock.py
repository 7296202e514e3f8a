"""The database's instance lock (db/instance_lock.py), below the bot: one holder, a wait, a clear refusal.

tests/test_two_processes.py runs two real `qwenbot run` processes against it.
"""

from __future__ import annotations

import asyncio
import os
import stat

import pytest

from db import DatabaseInUse, InstanceLock


def test_one_holder_at_a_time_and_the_lock_file_names_it(tmp_path):
    first, second = InstanceLock(tmp_path / "bot.sqlite3"), InstanceLock(tmp_path / "bot.sqlite3")
    assert first.try_acquire()
    assert not second.try_acquire()  # flock: even a second open file of the same process is refused
    assert second.holder() == str(os.getpid())
    assert first.path == tmp_path / "bot.sqlite3.lock"
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    first.release()
    first.release()  # idempotent
    assert second.try_acquire()
    second.release()


async def test_a_waiting_process_gets_the_lock_when_the_holder_lets_go(tmp_path):
    holder, waiter = InstanceLock(tmp_path / "bot.sqlite3"), InstanceLock(tmp_path / "bot.sqlite3")
    assert holder.try_acquire()
    waiting = asyncio.create_task(waiter.acquire(30))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    holder.release()
    assert await asyncio.wait_for(waiting, 10) is True
    waiter.release()


async def test_a_wait_that_runs_out_is_one_clear_error_and_a_stop_ends_it(tmp_path):
    holder, waiter = InstanceLock(tmp_path / "bot.sqlite3"), InstanceLock(tmp_path / "bot.sqlite3")
    assert holder.try_acquire()
    with pytest.raises(DatabaseInUse) as refused:
        await waiter.acquire(0.3)
    assert str(refused.value) == (f"another qwenbot run (pid {os.getpid()}) is serving the database "
                                  f"{tmp_path / 'bot.sqlite3'}; waited 0.3 s for it to stop")
    stop = asyncio.Event()
    stop.set()
    assert await waiter.acquire(30, stop) is False  # SIGTERM while waiting: nothing to serve, nothing to refuse
    holder.release()
