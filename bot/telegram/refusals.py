"""Who was refused lately: a sender without access is told so once per REFUSAL_INTERVAL_SECONDS, then hears nothing.

Every refusal is a message, and messages spend the bot's budgets (30 per second, 20 per minute in a group): a
stranger writing a thousand times must not cost a thousand of them. The record is in memory (a restart forgets
it: one more refusal each, at worst) and forgets each sender once their interval is over, so it stays small; a
sender who has access again is forgotten at once.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable


class RefusalLog:
    """When each recently refused sender was told."""

    def __init__(self, interval_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.interval = interval_seconds
        self._clock = clock
        self._told: OrderedDict[int, float] = OrderedDict()  # sender → when told, oldest first

    def may_tell(self, user_id: int) -> bool:
        """Whether `user_id` may be told now; if so, it is recorded as told (check and record in one step)."""
        now = self._clock()
        self._forget_older_than(now - self.interval)
        if user_id in self._told:
            return False
        self._told[user_id] = now
        return True

    def forget(self, user_id: int) -> None:
        """The sender may be told again at their next refusal: theirs was not sent after all, or they had access
        since (an admin's /deny after an /allow is news worth a message)."""
        self._told.pop(user_id, None)

    def __len__(self) -> int:
        return len(self._told)

    def _forget_older_than(self, limit: float) -> None:
        # Insertion order is time order (a sender is only added again after being forgotten), so the oldest
        # are at the front: each call drops those whose interval is over and stops at the first recent one.
        while self._told and next(iter(self._told.values())) <= limit:
            self._told.popitem(last=False)
