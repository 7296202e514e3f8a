"""Turn order: per chat session, turns run in the order their messages arrived; per user, one at a time.

A handler `reserve`s a slot before its first `await`, so the slot order is the update order. A slot then waits
for the previous slot of its session and the previous slot of its user; both were reserved earlier, so no two
slots can wait on each other and there is no deadlock. Other chats and users go on in parallel.

Each slot carries the `CancelToken` its turn gives the model: `/cancel` and shutdown set it, and a slot cancelled
while still waiting never runs. A slot keeps its place until its answer is delivered (bot/telegram/questions.py
`deliver`): an answer Telegram does not take yet holds up the later answers of its chat, never the other chats.

The scheduler also counts each user's pending slots (for MAX_PENDING_QUESTIONS) and remembers which notices a
user was given while they wait ("your question is queued"), so each is given once per wait, not once per message.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from agent.llm.base import CancelToken

# Why a slot was cancelled.
BY_USER = "user"
BY_SHUTDOWN = "shutdown"
BY_TIMEOUT = "timeout"
BY_DATABASE_GONE = "database gone"  # the bot stops: its database file was deleted or replaced (db/file_watch.py)


@dataclass(eq=False)
class TurnSlot:
    """One question's place in line."""

    session_id: str
    user_id: int
    update_id: int | None
    # The turn's key in the store (`source_key`): its update's journal key, so a redelivered update is answered
    # from the store, not asked twice. None for a question that came through no journal.
    source_key: str | None = None
    cancel: CancelToken = field(default_factory=CancelToken)
    stopped: asyncio.Event = field(default_factory=asyncio.Event)  # set with `cancel`, for waits on the event loop
    cancelled_by: str | None = None
    running: bool = False
    answered: bool = False
    released: bool = False
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    after_session: asyncio.Future | None = None
    after_user: asyncio.Future | None = None
    # The same user's previous slot, until this one may run (then dropped, so finished slots are not kept alive).
    own_previous: "TurnSlot | None" = None

    @property
    def behind_own_turn(self) -> bool:
        """Whether the same user's previous question is still waiting or running, not cancelled and not answered:
        right after /cancel or its answer, the turn may take a moment to wind down, but nothing is queued behind
        it (a user who asks again the moment the answer arrives is not told to wait)."""
        previous = self.own_previous
        return (previous is not None and not previous.done.done() and previous.cancelled_by is None
                and not previous.answered)

    def stop(self, reason: str) -> None:
        """Cancel the turn (its model call stops at the next step) or, if it waits, its future run."""
        if self.cancelled_by is None:
            self.cancelled_by = reason
        self.cancel.cancel()
        self.stopped.set()


class TurnScheduler:
    """The slots of every waiting or running turn."""

    def __init__(self) -> None:
        self._session_tail: dict[str, TurnSlot] = {}
        self._user_tail: dict[int, TurnSlot] = {}
        self._slots: set[TurnSlot] = set()
        self._pending: dict[int, int] = {}  # user → slots waiting or running
        self._told: dict[int, set[str]] = {}  # user → notices given during the current wait
        self.closing = False
        # Updates whose turn shutdown stopped before its answer was delivered, by journal key (by update id for a
        # question that came through no journal): the journal keeps them unhandled, to be handled again after the
        # restart. Only this class writes or reads it.
        self._kept: set[str | int] = set()
        # The journal key of each update being handled, attached by the dispatcher (bot/telegram/intake.py) as it
        # hands the update to its handler: a slot reserved for that update takes it as its `source_key`.
        self._journal_keys: dict[int, str] = {}

    def attach_journal_key(self, update_id: int, source_key: str) -> None:
        """Update `update_id` is being handled; a turn it asks for is stored under `source_key`."""
        self._journal_keys[update_id] = source_key

    def detach_journal_key(self, update_id: int) -> None:
        """The handler of update `update_id` ended."""
        self._journal_keys.pop(update_id, None)

    def reserve(self, session_id: str, user_id: int, update_id: int | None = None) -> TurnSlot:
        """Take the next place in line for `session_id` and `user_id` (synchronous: call before any await)."""
        slot = TurnSlot(session_id, user_id, update_id, self._journal_keys.get(update_id))
        if (previous := self._session_tail.get(session_id)) is not None:
            slot.after_session = previous.done
        if (previous := self._user_tail.get(user_id)) is not None:
            slot.after_user, slot.own_previous = previous.done, previous
        self._session_tail[session_id] = slot
        self._user_tail[user_id] = slot
        self._slots.add(slot)
        self._pending[user_id] = self._pending.get(user_id, 0) + 1
        if self.closing:
            slot.stop(BY_SHUTDOWN)
        return slot

    async def wait_turn(self, slot: TurnSlot) -> bool:
        """Wait until the slot may run; False when it was cancelled meanwhile."""
        for earlier in (slot.after_session, slot.after_user):
            if earlier is not None:
                await asyncio.shield(earlier)
        slot.own_previous = None
        slot.running = slot.cancelled_by is None
        return slot.running

    def release(self, slot: TurnSlot) -> None:
        """The slot's turn is over (answered, refused or cancelled): let the next ones go. Idempotent."""
        if slot.released:
            return
        slot.released = True
        slot.running = False
        self._count_out(slot.user_id)
        if slot.cancelled_by == BY_SHUTDOWN and not slot.answered:
            self.keep_for_restart(slot)
        if not slot.done.done():
            slot.done.set_result(None)
        self._slots.discard(slot)
        # Forget tails that point at finished slots, so idle chats and users hold no memory.
        if self._session_tail.get(slot.session_id) is slot:
            del self._session_tail[slot.session_id]
        if self._user_tail.get(slot.user_id) is slot:
            del self._user_tail[slot.user_id]

    def _count_out(self, user_id: int) -> None:
        left = self._pending.pop(user_id, 1) - 1
        if left > 0:
            self._pending[user_id] = left
        else:
            self._told.pop(user_id, None)  # the wait is over: the next one gets its notices again

    def pending(self, user_id: int) -> int:
        """How many of the user's questions wait or run."""
        return self._pending.get(user_id, 0)

    def tell_once(self, user_id: int, notice: str) -> bool:
        """Whether `notice` is still to be given to the user in this wait (True once; call only while pending)."""
        told = self._told.setdefault(user_id, set())
        if notice in told:
            return False
        told.add(notice)
        return True

    def keep_for_restart(self, slot: TurnSlot) -> None:
        """Leave the slot's update unhandled in the journal, to be handled again after a restart."""
        if slot.source_key is not None or slot.update_id is not None:
            self._kept.add(slot.source_key or slot.update_id)

    def kept_for_restart(self, key: str | int) -> bool:
        """Whether the update (its journal key, or its id) is left to be handled again after a restart."""
        return key in self._kept

    def take_kept(self, key: str | int) -> bool:
        """Whether the update (its journal key) is left to be handled again; forgets it (its handler ended)."""
        if key in self._kept:
            self._kept.discard(key)
            return True
        return False

    def cancel(self, session_id: str, user_id: int | None = None) -> int:
        """Cancel the waiting and running turns of a session (only `user_id`'s, when given); how many."""
        chosen = [s for s in self._slots if s.session_id == session_id and s.cancelled_by is None
                  and (user_id is None or s.user_id == user_id)]
        for slot in chosen:
            slot.stop(BY_USER)
        return len(chosen)

    def cancel_all(self, reason: str = BY_SHUTDOWN) -> int:
        """Cancel every waiting and running turn (shutdown); how many."""
        chosen = [s for s in self._slots if s.cancelled_by is None]
        for slot in chosen:
            slot.stop(reason)
        return len(chosen)

    @property
    def active(self) -> int:
        """How many turns are waiting or running."""
        return len(self._slots)

    async def drained(self) -> None:
        """Wait until no turn waits or runs."""
        while self._slots:
            await asyncio.gather(*(asyncio.shield(s.done) for s in list(self._slots)))
