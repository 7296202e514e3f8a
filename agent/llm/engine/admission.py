"""Admission: which queued jobs join the next batch, and when a running batch pauses to let them in.

The model thread asks the policy twice: before each batch (`admit`: which jobs join the rows it resumes) and after
each step of a batch (`should_pause`: whether a waiting job should join at the next step). It is the one place
where who goes first is decided, so that another policy (fairness across users, low-priority background jobs)
replaces one small class.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from agent.llm.engine.jobs import Job, JobQueue


class Admission(Protocol):
    """What the model thread asks of an admission policy."""

    batch_size: int

    def admit(self, jobs: JobQueue, running: int) -> list[Job]:
        """The queued jobs that join the `running` rows the next batch resumes (waiting for one when there are
        none)."""
        ...

    def should_pause(self, jobs: JobQueue, live: int) -> bool:
        """Whether a batch with `live` unfinished rows should pause after this step, to let waiting jobs join."""
        ...


@dataclass(frozen=True)
class FirstComeAdmission:
    """First come, first served, up to `batch_size` rows; a batch may wait `batch_wait` seconds for company."""

    batch_size: int
    batch_wait: float = 0.0  # seconds a batch may wait, from its first job's arrival, for more jobs

    def admit(self, jobs: JobQueue, running: int) -> list[Job]:
        """Wait for one job (when nothing runs), then take what else arrives within `batch_wait` of it, up to the
        batch's room.

        Turns that start together reach the model a few milliseconds apart (each first reads its history);
        without the wait the first would run alone and the rest in a second batch, and their next calls
        would stay out of step. Jobs that queued while a batch ran are past their wait and go at once.
        """
        room = self.batch_size - running
        batch: list[Job] = []
        if room <= 0:
            return batch
        job = jobs.get(block=not running)
        while job is not None:
            batch.append(job)
            if len(batch) >= room:
                break
            wait = batch[0].submitted_at + self.batch_wait - time.monotonic()
            job = jobs.get(timeout=wait) if wait > 0 else jobs.get(block=False)
        return batch

    def should_pause(self, jobs: JobQueue, live: int) -> bool:
        """A job waits that the batch has room for (rows that ended free their place): the batch pauses after this
        step, and the newcomer joins the next one."""
        return not jobs.empty() and live < self.batch_size
