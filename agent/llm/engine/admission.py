"""Admission: which queued jobs join the next batch, which paused rows go on, and when a running batch pauses.

The model thread asks the policy three times around each batch: which of the rows paused in the last batch
resume now (`resume`), which queued jobs join them (`admit`), and, after each step, whether the batch should
pause so that a waiting job can join at the next step (`should_pause`). It is the one place where who goes first is
decided.

`FairAdmission`, the engine's policy:

- **Round-robin across users.** Each job carries its caller's key (`Job.user_key`: a user, or a session when no
  user is known). The keys waiting are served in turn, the one served longest ago first, one job each per round:
  with one user's ten calls queued and another user's one, the other user's call is admitted next. Jobs of one key
  keep their order. (In Telegram one user has at most one running question, so what reaches this queue per user is
  one call at a time; bursts come from evaluations, the terminal and many chats at once.)
- **Low priority** (`Priority.LOW`, e.g. a history summary): admitted only when no person's job waits or runs, at
  most `low_rows` of them in a batch, and never beside a person's row: when a person's job arrives, the batch pauses
  after its current step and the low rows are held aside (keeping their KV) until no person's job waits or runs.
  On a CPU every row makes each step dearer, and a newcomer's prompt is computed before the batch goes on, so a
  summary sharing a batch would slow the people in it; apart, a person's call waits at most for the step in
  progress. The price: while people keep the model busy without a pause, summaries wait (the history window then
  simply holds the newest turns that fit, as without summaries).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol, Sequence

from agent.llm.engine.jobs import Job, JobQueue

SERVED_KEYS_KEPT = 4096  # users remembered for the round-robin; the least recently served are forgotten first


class Admission(Protocol):
    """What the model thread asks of an admission policy."""

    batch_size: int

    def resume(self, jobs: JobQueue, paused: Sequence[Job]) -> list[Job]:
        """Of the jobs whose rows the last batch paused, those that go on in the next batch (the rest are held
        aside, with their KV, and asked about again before the batch after)."""
        ...

    def admit(self, jobs: JobQueue, running: Sequence[Job]) -> list[Job]:
        """The queued jobs that join the `running` ones in the next batch (waiting for one when none runs); they are
        taken off the queue."""
        ...

    def should_pause(self, jobs: JobQueue, live: Sequence[Job]) -> bool:
        """Whether a batch whose unfinished rows belong to `live` should pause after this step, to let waiting
        jobs join (or a person's job take a low row's place)."""
        ...


@dataclass(frozen=True)
class BatchLimits:
    """How the engine batches: rows at once, how long a batch waits for company, background rows at once. The one
    place of these defaults (BATCH_SIZE, BATCH_WAIT_MS and LOW_PRIORITY_ROWS read them here)."""

    batch_size: int = 8
    batch_wait_ms: int = 20
    low_priority_rows: int = 1


@dataclass
class FairAdmission:
    """Round-robin across user keys, up to `batch_size` rows; background (LOW) jobs only while no person's job
    waits or runs.

    A batch may wait `batch_wait` seconds, from its first job's arrival, for company.
    """

    batch_size: int
    batch_wait: float = 0.0  # seconds a batch may wait, from its first job's arrival, for more jobs
    low_rows: int = BatchLimits.low_priority_rows  # background rows a batch may hold at once
    _served: dict[str, int] = field(default_factory=dict)  # user key → when it was last admitted (a counter)
    _tick: int = 0

    def resume(self, jobs: JobQueue, paused: Sequence[Job]) -> list[Job]:
        """Every person's row; the low rows only when no person's row goes on and no person's job waits."""
        people = [job for job in paused if not job.low]
        if people or any(not job.low for job in jobs.waiting()):
            return people
        return [job for job in paused if job.low]

    def admit(self, jobs: JobQueue, running: Sequence[Job]) -> list[Job]:
        """Wait for one job (when nothing runs), then for what else arrives within `batch_wait` of the first one
        waiting, up to the batch's room; choose among them (round-robin, people first) and take them.

        Turns that start together reach the model a few milliseconds apart (each first reads its history);
        without the wait the first would run alone and the rest in a second batch, and their next calls
        would stay out of step. Jobs that queued while a batch ran are past their wait and go at once.
        """
        room = self.batch_size - len(running)
        if room <= 0 or (not running and not jobs.wait_for(bool)):
            return []
        waiting = jobs.waiting()
        if not waiting:
            return []
        left = min(job.submitted_at for job in waiting) + self.batch_wait - time.monotonic()
        if left > 0 and len(waiting) < room:
            jobs.wait_for(lambda queued: len(queued) >= room, left)
            waiting = jobs.waiting()
        chosen = self.choose(waiting, running, room)
        jobs.take(chosen)
        return chosen

    def choose(self, waiting: Sequence[Job], running: Sequence[Job], room: int) -> list[Job]:
        """Up to `room` of the `waiting` jobs: people's round-robin by user key; background jobs (oldest first) only
        when no person's job waits or runs, up to `low_rows` in the batch."""
        people = [job for job in waiting if not job.low]
        if people:
            return self._round_robin(people, room)
        if any(not job.low for job in running):
            return []
        low_room = min(room, self.low_rows - len(running))
        return [job for job in waiting if job.low][:max(0, low_room)]

    def should_pause(self, jobs: JobQueue, live: Sequence[Job]) -> bool:
        """Pause when a waiting job could join: a person's job when the batch has room, or holds low rows (to be
        held aside); a background job only into a batch of background rows, below `low_rows`."""
        waiting = jobs.waiting()
        if not waiting:
            return False
        if any(not job.low for job in waiting):
            return len(live) < self.batch_size or any(job.low for job in live)
        return all(job.low for job in live) and len(live) < min(self.batch_size, self.low_rows)

    def _round_robin(self, jobs: Sequence[Job], room: int) -> list[Job]:
        """Up to `room` jobs, one per key per round, keys in the order they were last served (never first)."""
        queues: dict[str, deque[Job]] = {}
        for job in jobs:  # arrival order: a key's jobs stay in order, and ties go to the key that came first
            queues.setdefault(job.user_key, deque()).append(job)
        order = sorted(queues, key=lambda key: self._served.get(key, -1))
        chosen: list[Job] = []
        while len(chosen) < room and any(queues.values()):
            for key in order:
                if queues[key] and len(chosen) < room:
                    chosen.append(queues[key].popleft())
                    self._mark_served(key)
        return chosen

    def _mark_served(self, key: str) -> None:
        self._tick += 1
        self._served.pop(key, None)
        self._served[key] = self._tick  # re-inserted: the dict stays in the order keys were last served
        if len(self._served) > SERVED_KEYS_KEPT:
            del self._served[next(iter(self._served))]
