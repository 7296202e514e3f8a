"""Admission on the model thread: round-robin across users, background (summary) jobs only while nobody waits.

The policy is exercised with real `Job`s on the real `JobQueue`, then on the real model thread with the offline
model (batches of one row, so the order rows start in is the order they finish in).
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from agent.llm.base import Completion, ModelRequest, Priority
from agent.llm.engine.admission import FairAdmission
from agent.llm.engine.jobs import Job, JobQueue
from tests.real_model import real_model_test, started_local_llm

SKY = [{"role": "user", "content": "Why is the sky blue?"}]


def job(user: str, priority: Priority = Priority.NORMAL) -> Job:
    loop = asyncio.get_running_loop()
    return Job(SKY, (), 4, None, loop, loop.create_future(), user_key=user, priority=priority)


def queued(*jobs: Job) -> JobQueue:
    queue = JobQueue()
    for item in jobs:
        queue.put(item)
    return queue


async def test_one_users_burst_does_not_keep_another_user_waiting() -> None:
    alice_calls = [job("alice") for _ in range(10)]
    bob_call = job("bob")
    queue = queued(*alice_calls, bob_call)
    admission = FairAdmission(batch_size=1)
    started = [admission.admit(queue, [])[0] for _ in range(11)]
    assert started[0] is alice_calls[0]
    assert started[1] is bob_call  # next, ahead of alice's nine others
    assert started[2:] == alice_calls[1:]  # alice's own calls keep their order
    assert queue.empty()


async def test_keys_take_turns_one_job_each_per_round_within_a_batch() -> None:
    calls = [job("alice"), job("alice"), job("alice"), job("bob"), job("carol"), job("bob")]
    admission = FairAdmission(batch_size=4)
    chosen = admission.admit(queued(*calls), [])
    assert [c.user_key for c in chosen] == ["alice", "bob", "carol", "alice"]


async def test_the_user_served_longest_ago_goes_first() -> None:
    admission = FairAdmission(batch_size=1)
    first = queued(job("alice"), job("bob"))
    assert admission.admit(first, [])[0].user_key == "alice"
    assert admission.admit(first, [])[0].user_key == "bob"
    # alice and bob were both served; carol never: she goes first, then alice (served longer ago than bob).
    second = queued(job("bob"), job("alice"), job("carol"))
    assert [admission.admit(second, [])[0].user_key for _ in range(3)] == ["carol", "alice", "bob"]


async def test_a_background_job_waits_while_any_persons_job_waits() -> None:
    summary = job("alice", Priority.LOW)
    question = job("bob")
    queue = queued(summary, question)
    admission = FairAdmission(batch_size=1)
    assert admission.admit(queue, []) == [question]  # although the summary came first
    assert admission.admit(queue, []) == [summary]


async def test_background_rows_are_capped_and_never_run_beside_a_persons_row() -> None:
    summaries = [job(f"s{i}", Priority.LOW) for i in range(3)]
    admission = FairAdmission(batch_size=4, low_rows=2)
    queue = queued(*summaries)
    assert admission.admit(queue, []) == summaries[:2]  # up to low_rows background rows at a time
    assert admission.admit(queue, summaries[:2]) == []
    people = [job("alice"), job("bob")]
    assert admission.admit(queue, people) == []  # people are running: the summary waits
    assert not admission.should_pause(queue, people)  # nothing could join: no reason to pause


async def test_a_person_arriving_at_a_full_batch_pauses_it_and_the_background_row_is_held_aside() -> None:
    summary, alice, bob = job("s", Priority.LOW), job("alice"), job("bob")
    admission = FairAdmission(batch_size=2)
    queue = queued(carol := job("carol"))
    assert admission.should_pause(queue, [summary, alice])
    assert admission.resume(queue, [summary, alice]) == [alice]  # the summary makes room
    assert admission.admit(queue, [alice]) == [carol]
    empty = JobQueue()
    assert admission.resume(empty, [summary, alice]) == [alice]  # a person's row goes on: the summary waits
    assert admission.resume(empty, [summary]) == [summary]  # nobody waits or runs: it goes on
    assert not admission.should_pause(queued(bob), [alice, carol])  # full of people: the newcomer waits


async def test_a_waiting_background_job_joins_only_a_batch_of_background_rows_below_the_cap() -> None:
    two = FairAdmission(batch_size=4, low_rows=2)
    assert two.should_pause(queued(job("s", Priority.LOW)), [job("t", Priority.LOW)])
    assert not two.should_pause(queued(job("s", Priority.LOW)), [job("alice")])
    one = FairAdmission(batch_size=4, low_rows=1)
    assert not one.should_pause(queued(job("s", Priority.LOW)), [job("t", Priority.LOW)])


async def test_the_served_memory_stays_bounded() -> None:
    admission = FairAdmission(batch_size=1)
    for index in range(5000):
        admission.admit(queued(job(f"user{index}")), [])
    assert len(admission._served) <= 4096


# --- on the real model thread --------------------------------------------------------------------------------

@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def one_row_llm():
    """The offline model with batches of one row: rows run one after another, in the order admitted."""
    backend = await started_local_llm(batch_size=1, prefix_cache_mb=64)  # a batch pauses only with a store
    yield backend
    await backend.close()


@real_model_test
async def test_on_the_model_thread_the_second_users_question_starts_next(one_row_llm) -> None:
    finished: list[str] = []

    async def ask(name: str, user: str, tokens: int = 4) -> Completion:
        completion = await one_row_llm.complete(ModelRequest(SKY, max_new_tokens=tokens, user_key=user))
        finished.append(name)
        return completion

    first = asyncio.create_task(ask("alice-0", "alice", tokens=24))  # keeps the model busy while the rest queue
    await asyncio.sleep(0.2)
    burst = [asyncio.create_task(ask(f"alice-{i}", "alice")) for i in range(1, 10)]
    await asyncio.sleep(0.05)
    bob = asyncio.create_task(ask("bob", "bob"))
    await asyncio.gather(first, *burst, bob)
    assert finished[:2] == ["alice-0", "bob"]
    assert finished[2:] == [f"alice-{i}" for i in range(1, 10)]


@real_model_test
async def test_on_the_model_thread_a_summary_steps_aside_for_a_users_question(one_row_llm) -> None:
    finished: list[str] = []

    async def call(name: str, request: ModelRequest) -> None:
        await one_row_llm.complete(request)
        finished.append(name)

    summary = asyncio.create_task(call("summary", ModelRequest(SKY, max_new_tokens=64, user_key="tg:1",
                                                               priority=Priority.LOW)))
    await asyncio.sleep(0.3)  # the summary is generating, alone
    assert not summary.done()
    await call("question", ModelRequest(SKY, max_new_tokens=4, user_key="tg:2"))
    assert finished == ["question"]  # answered while the summary, held aside, waited
    await summary
    assert finished == ["question", "summary"]


@pytest.mark.parametrize("rows", [1, 3])
async def test_the_policy_never_admits_more_than_the_batch_holds(rows: int) -> None:
    admission = FairAdmission(batch_size=rows, low_rows=2)
    queue = queued(*[job(f"u{i % 3}") for i in range(7)], *[job("s", Priority.LOW) for _ in range(3)])
    running: list[Job] = []
    while not queue.empty():
        admitted = admission.admit(queue, running)
        assert len(admitted) <= rows
        running = []
