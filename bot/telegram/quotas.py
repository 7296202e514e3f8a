"""Daily quotas per user: questions (turns) and generated tokens per UTC day, counted from the turns table.

USER_DAILY_TURNS and USER_DAILY_TOKENS are everyone's limits (0 = unlimited); an admin's /quota_set gives one user
their own (`user_quotas`). Admins are exempt (the question path asks `AccessControl.is_admin` first). A turn counts
unless it failed in the backend (`error`): a user does not pay for the bot's own failure. Tokens are the completion
tokens of the user's turns, what the model generated for them.

A refused question is told why and when the day resets once per user and day (`tell_once`), then dropped quietly:
a user who keeps writing is not answered with a refusal each time. That record is in memory; a restart forgets it
(one more refusal each, at worst).

The clock is a function (`clock`), so a test moves a day forward without sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Callable

from agent.steps import TurnStatus
from bot.program.config import QuotasSettings
from db import Database

TURNS = "turns"
TOKENS = "tokens"
KINDS = (TURNS, TOKENS)


def utc_clock() -> datetime:
    """Now, in UTC."""
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class QuotaState:
    """One of a user's daily limits today: the limit (0 = unlimited), what was used, and whose limit it is."""

    kind: str
    limit: int
    used: int
    own: bool  # set for this user by /quota_set (else the setting's)

    @property
    def unlimited(self) -> bool:
        """Whether there is no limit."""
        return self.limit == 0

    @property
    def left(self) -> int:
        """What is left today (0 when used up; meaningless when unlimited)."""
        return max(self.limit - self.used, 0)

    @property
    def exhausted(self) -> bool:
        """Whether no more is allowed today."""
        return not self.unlimited and self.used >= self.limit


@dataclass(frozen=True)
class Window:
    """Today's window: from its start to the next reset (UTC midnights)."""

    start: datetime
    reset: datetime

    def until_reset(self, now: datetime) -> timedelta:
        """The time left until the reset."""
        return max(self.reset - now, timedelta(0))


class Quotas:
    """Users' daily limits and what they used today."""

    def __init__(self, db: Database, settings: QuotasSettings, clock: Callable[[], datetime] = utc_clock):
        self.db = db
        self.settings = settings
        self.clock = clock
        self._told: dict[int, datetime] = {}  # user → the window start of the day they were last told

    def window(self) -> Window:
        """Today's window (a UTC day)."""
        start = self.clock().astimezone(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        return Window(start, start + timedelta(days=1))

    async def states(self, user_id: int) -> list[QuotaState]:
        """The user's limits (turns, then tokens) and what they used of each today."""
        own = await self._own_limits(user_id)
        used = await self._used(user_id, self.window().start)
        defaults = {TURNS: self.settings.user_daily_turns, TOKENS: self.settings.user_daily_tokens}
        return [QuotaState(kind, own.get(kind, defaults[kind]), used[kind], kind in own) for kind in KINDS]

    async def exhausted(self, user_id: int) -> QuotaState | None:
        """The first of the user's limits used up today, or None when they may ask."""
        return next((state for state in await self.states(user_id) if state.exhausted), None)

    def tell_once(self, user_id: int) -> bool:
        """Whether the user is still to be told today that their quota is used up (True once per day)."""
        start = self.window().start
        if self._told.get(user_id) == start:
            return False
        self._told = {user: day for user, day in self._told.items() if day == start}  # yesterday's are done
        self._told[user_id] = start
        return True

    async def set_limit(self, user_id: int, kind: str, limit: int | None, by: int | None) -> None:
        """Give the user their own daily `limit` of `kind` (0 = unlimited); None returns them to the setting."""
        if kind not in KINDS:
            raise KeyError(kind)
        async with self.db.transaction() as conn:
            if limit is None:
                await conn.execute("DELETE FROM user_quotas WHERE user_id = ? AND kind = ?", (user_id, kind))
                return
            await conn.execute(
                "INSERT INTO user_quotas (user_id, kind, daily_limit, set_by) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (user_id, kind) DO UPDATE SET daily_limit = excluded.daily_limit, "
                "set_by = excluded.set_by, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
                (user_id, kind, limit, by))

    async def _own_limits(self, user_id: int) -> dict[str, int]:
        rows = await self.db.fetchall("SELECT kind, daily_limit FROM user_quotas WHERE user_id = ?", (user_id,))
        return {kind: int(limit) for kind, limit in rows}

    async def _used(self, user_id: int, since: datetime) -> dict[str, int]:
        row = await self.db.fetchone(
            "SELECT count(*), COALESCE(sum(completion_tokens), 0) FROM turns "
            "WHERE user_id = ? AND started_at >= ? AND status != ?",
            (user_id, stored_time(since), TurnStatus.ERROR))
        return {TURNS: int(row[0]), TOKENS: int(row[1])}


def stored_time(moment: datetime) -> str:
    """A moment as the turns table stores times (agent/memory.py's `utc_now`), so that they compare as text."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
