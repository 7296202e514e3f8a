"""Is the bot well? The checks behind /healthz, `qwenbot health` and the systemd watchdog.

    process     it answers (and how long it has been up)
    event loop  the loop that runs every chat answers within HEALTH_CHECK_TIMEOUT_SECONDS (a blocked loop freezes
                every chat while the process looks alive)
    database    the file and its folder take writes (a file made read-only, a read-only mount), and a connection of
                its own commits one (the `health_checks` row: a full disk, a lock held for good), where the bot's
                own connection would only meet them mid-turn
    model       the backend's worker (the local engine's model thread) is alive, and not stuck: with work to do,
                it made a step within HEALTH_MODEL_STALL_SECONDS
    telegram    Telegram answered a call within HEALTH_TELEGRAM_SECONDS (an idle bot asks getMe to find out)

`run()` blocks (it waits for the event loop and for SQLite): call it from another thread, never from the loop
itself. Until the services have started, the report says so and is not healthy.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bot.program.config import Settings

if TYPE_CHECKING:
    from bot.program.services import Services


class ReachClock(Protocol):
    """When Telegram last answered: what the Telegram adapter keeps (bot/telegram/requests.py)."""

    def seconds_since_reached(self) -> float | None: ...

PROBE_SQL = ("INSERT INTO health_checks (id, checked_at) VALUES (1, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')) "
             "ON CONFLICT (id) DO UPDATE SET checked_at = excluded.checked_at")


@dataclass(frozen=True)
class Finding:
    """One check: its name, whether it passed, and what was found."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class HealthReport:
    """Every check's finding; healthy when all passed."""

    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        """Whether every check passed."""
        return all(finding.ok for finding in self.findings)

    def as_json(self) -> dict[str, Any]:
        """The body of /healthz."""
        return {"status": "ok" if self.ok else "unhealthy",
                "checks": {f.name: {"ok": f.ok, "detail": f.detail} for f in self.findings}}


class HealthCheck:
    """The checks of one running bot; `attach` the services once they have started."""

    def __init__(self, settings: Settings, loop: asyncio.AbstractEventLoop, telegram_calls: ReachClock):
        self.limits = settings.metrics
        self.loop = loop
        self.telegram_calls = telegram_calls
        self.services: "Services | None" = None
        self.started = time.monotonic()

    def attach(self, services: "Services") -> None:
        """The services are up: check them from now on."""
        self.services = services

    def run(self) -> HealthReport:
        """Run every check (blocking: call it off the event loop)."""
        findings = [self.process(), self.event_loop()]
        services = self.services
        if services is None:
            starting = "starting: the database, the model and Telegram are not up yet"
            findings += [Finding(name, False, starting) for name in ("database", "model", "telegram")]
        else:
            findings += [self.database(services.db.path), self.model(services), self.telegram()]
        return HealthReport(tuple(findings))

    def process(self) -> Finding:
        return Finding("process", True, f"pid {os.getpid()}, up {time.monotonic() - self.started:.0f} s")

    def event_loop(self) -> Finding:
        timeout = self.limits.health_check_timeout_seconds
        future = asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.loop)
        try:
            future.result(timeout)
        except TimeoutError:
            future.cancel()
            return Finding("event loop", False, f"did not answer within {timeout:g} s: every chat is frozen")
        except RuntimeError as error:  # the loop is closed: the bot is stopping
            return Finding("event loop", False, f"not running: {error}")
        return Finding("event loop", True, "answers")

    def database(self, path: Path) -> Finding:
        if (refused := write_protection(path)) is not None:
            return Finding("database", False, refused)
        try:
            probe_database(path, self.limits.health_check_timeout_seconds)
        except sqlite3.Error as error:
            return Finding("database", False, f"{path} does not take a write: {error}")
        return Finding("database", True, f"{path} takes a write")

    def model(self, services: "Services") -> Finding:
        activity = services.llm.activity()
        if activity is None:
            return Finding("model", True, f"{services.llm.name} backend (no model thread of its own)")
        if not activity.alive:
            return Finding("model", False, f"the model thread has stopped{': ' + activity.detail if activity.detail else ''}")
        stall = self.limits.health_model_stall_seconds
        if activity.working and activity.seconds_since_progress > stall:
            return Finding("model", False, f"the model thread has work but made no step for "
                                           f"{activity.seconds_since_progress:.0f} s (HEALTH_MODEL_STALL_SECONDS="
                                           f"{stall:g})")
        state = "working" if activity.working else "idle"
        return Finding("model", True, f"the model thread is alive ({state}, last step "
                                      f"{activity.seconds_since_progress:.0f} s ago)")

    def telegram(self) -> Finding:
        limit = self.limits.health_telegram_seconds
        since = self.telegram_calls.seconds_since_reached()
        if since is None:
            return Finding("telegram", False, "not reached yet")
        if since > limit:
            return Finding("telegram", False, f"last reached {since:.0f} s ago (HEALTH_TELEGRAM_SECONDS={limit:g})")
        return Finding("telegram", True, f"reached {since:.0f} s ago")


def write_protection(path: Path) -> str | None:
    """Why the database file or its folder (where SQLite creates `-wal` and `-shm`) refuses writes now; None when
    neither does.

    Asked of the system (access(2), statvfs), never by opening the file: SQLite in this process reuses the
    descriptors it opened before the protection came, so a probe connection alone would still write; and closing
    any descriptor of the file would drop the locks the bot's own connection holds on it."""
    for where in (path, path.parent):
        if not os.access(where, os.W_OK):
            if os.statvfs(where).f_flag & os.ST_RDONLY:
                return f"{where} is on a read-only mount"
            status = where.stat()
            return (f"{where} is write-protected for this process (mode {status.st_mode & 0o7777:04o}, owner uid "
                    f"{status.st_uid}; or an immutable attribute)")
    return None


def probe_database(path: Path, timeout: float) -> None:
    """Commit one write on a connection of its own; raises `sqlite3.Error` when the database does not take it.

    `mode=rw` never creates a missing file, and opens a file the system write-protects read-only, so that the write
    fails here as it would for the bot."""
    with closing(sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=timeout, isolation_level=None)) as conn:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(PROBE_SQL)
            conn.execute("COMMIT")
        except sqlite3.Error:
            conn.execute("ROLLBACK")
            raise
