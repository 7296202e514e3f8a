"""Load: 100 users in 20 chats send 5 questions each at once; every one is answered once, in order, and stored once.

The load is bench/bench_load.py's: half the chats private, the rest groups where questions are addressed (`/ask`
or an @mention) among chatter that must be ignored, every message queued on the fake Bot API server at once. The
scripted model answers each question by its tag after MODEL_DELAY seconds per call (course questions call
course_query first). Those delays overlap across chats, like a model thread batching the pending calls of all
chats: a stand-in for the real model, whose speed is bench/bench_local.py's subject, not this test's.

One test runs the burst four times (2,000 turns, 35-50 s on 2 cores): the first two rounds warm the process up
(connections, caches, SQLite's page cache, full history windows), the last two show that memory stays flat. Memory
is this process's, fake server included, measured when idle: RSS (which also holds the allocator's warm-up, bounded
and slowing) and the interpreter's live objects (exact: flat within a few hundred). Telegram's own rate limits are
lifted, as the fake does not enforce them (see bench/bench_load.py).
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections import Counter, defaultdict

from bench.bench_load import (ANSWER_PREFIX, QUESTION_TAG, Population, RoundResult, Sent, population,
                              round_messages, rss_bytes, run_round, start_load_bot)
from bot.telegram.i18n import text
from db.write_lock import WriteLock
from tests.fakes.telegram_bot import RunningBot, telegram_server

__all__ = ["telegram_server"]  # the fixture, used by name

USERS, CHATS, MESSAGES = 100, 20, 5
MODEL_DELAY = 0.03  # seconds per model call
ROUNDS, WARM_ROUNDS = 4, 2
# Growth allowed over the 1,000 turns after warm-up: fixed amounts, well below what keeping anything per turn
# would cost (an Update with its Message, Chat and User alone is dozens of objects and a few KiB).
MAX_RSS_GROWTH = 4 * 2**20
MAX_OBJECT_GROWTH = 1_000  # sys.getallocatedblocks(), live objects and buffers: under one per turn (noise: ±200)
IDLE_CONNECTION_SECONDS = 5.5  # httpx closes a connection idle for 5 s (python-telegram-bot keeps its default)
# Small enough that every session's history window is full by the end of warm-up, so later rounds do the same work.
HISTORY_TOKEN_BUDGET = 300


async def test_a_burst_from_100_users_in_20_chats_is_answered_once_in_order_stored_once_with_flat_memory(
        telegram_server, tmp_path):
    crowd = population(USERS, CHATS)
    bot = await start_load_bot(telegram_server, tmp_path, crowd, MODEL_DELAY,
                               history_token_budget=HISTORY_TOKEN_BUDGET)
    memory: list[tuple[int, int]] = []
    stored = HistoryCursor()
    try:
        for round_no in range(1, ROUNDS + 1):
            result = await run_round(bot, crowd, round_no, MESSAGES, helps=True)
            check_answers(result)
            check_help(result)
            check_model(result)
            await stored.check(bot, result)
            del result  # the round's records are the test's, not the bot's memory
            if round_no in (WARM_ROUNDS, ROUNDS):
                memory.append(await memory_when_idle(bot, crowd))
    finally:
        await bot.stop()

    (rss_warm, objects_warm), (rss_end, objects_end) = memory[0], memory[-1]
    turns_after_warm_up = (ROUNDS - WARM_ROUNDS) * USERS * MESSAGES
    assert rss_end - rss_warm < MAX_RSS_GROWTH, \
        f"RSS grew {(rss_end - rss_warm) / 2**20:.1f} MiB over {turns_after_warm_up} turns: {memory}"
    assert objects_end - objects_warm < MAX_OBJECT_GROWTH, \
        f"{objects_end - objects_warm} more live objects after {turns_after_warm_up} turns: {memory}"


def test_the_load_has_private_chats_and_groups_with_chatter():
    crowd = population(USERS, CHATS)
    kinds = Counter(chat.type for chat in crowd.chats)
    assert kinds == {"private": 10, "supergroup": 10}
    assert sorted(len(users) for users in crowd.members.values()) == [1] * 10 + [9] * 10
    assert len({user.id for users in crowd.members.values() for user in users}) == USERS

    messages = round_messages(crowd, 1, MESSAGES, "qwen_test_bot")
    assert sum(m.addressed for m in messages) == USERS * MESSAGES
    chatter = [m for m in messages if not m.addressed]
    assert len(chatter) == 90 and all(m.chat.type == "supergroup" for m in chatter)
    group_questions = [m.text for m in messages if m.addressed and m.chat.type == "supergroup"]
    assert {text.split()[0] for text in group_questions} == {"/ask", "@qwen_test_bot"}


# --- the write lock: the update journal goes before the turns' writes -----------------------------------------

async def test_an_urgent_writer_goes_before_the_ordinary_writers_already_waiting():
    lock, order = WriteLock(), []

    async def write(name: str, urgent: bool = False) -> None:
        async with lock.hold(urgent):
            order.append(name)
            await asyncio.sleep(0.01)

    holder = asyncio.create_task(write("holder"))
    await asyncio.sleep(0)
    turns = [asyncio.create_task(write(f"turn {i}")) for i in range(3)]
    await asyncio.sleep(0)
    journal = asyncio.create_task(write("journal", urgent=True))
    await asyncio.wait_for(asyncio.gather(holder, *turns, journal), 5)
    assert order == ["holder", "journal", "turn 0", "turn 1", "turn 2"]


async def test_a_cancelled_waiter_neither_blocks_the_write_lock_nor_keeps_it():
    lock, entered, release = WriteLock(), [], asyncio.Event()

    async def write(name: str, until: asyncio.Event | None = None) -> None:
        async with lock.hold():
            entered.append(name)
            if until is not None:
                await until.wait()

    holder = asyncio.create_task(write("holder", release))
    await asyncio.sleep(0)
    gone, handed, last = (asyncio.create_task(write(name)) for name in ("gone", "handed", "last"))
    await asyncio.sleep(0)
    gone.cancel()  # cancelled while waiting
    release.set()
    await asyncio.sleep(0)  # the holder leaves and hands the lock to "handed", which has not run yet...
    handed.cancel()  # ...and is cancelled now: it must pass the lock on
    await asyncio.wait_for(asyncio.gather(holder, gone, handed, last, return_exceptions=True), 5)
    assert entered == ["holder", "last"]
    await asyncio.wait_for(write("afterwards"), 1)  # free again
    assert entered[-1] == "afterwards"


# --- checks on one round ---------------------------------------------------------------------------------------

def check_answers(result: RoundResult) -> None:
    """Each question: exactly one answer, replying to it and naming it; per chat in the order asked; chatter: none."""
    answers = result.answers()
    replied = Counter((a.chat_id, a.reply_to) for a in answers)
    unanswered = [q.tag for q in result.questions if replied[(q.chat_id, q.message_id)] == 0]
    assert not unanswered, f"{len(unanswered)} questions without an answer, e.g. {unanswered[:5]}"
    twice = [key for key, count in replied.items() if count > 1]
    assert not twice, f"answered more than once: {twice[:5]}"
    assert len(answers) == len(result.questions)

    by_message = {(q.chat_id, q.message_id): q for q in result.questions}
    for answer in answers:
        assert answer.text == expected_answer(by_message[(answer.chat_id, answer.reply_to)])
    for chat_id, asked in questions_by_chat(result.questions).items():
        in_order = [a.reply_to for a in answers if a.chat_id == chat_id]
        assert in_order == [q.message_id for q in asked], f"answers out of order in chat {chat_id}"
    check_no_other_messages(result)


def check_no_other_messages(result: RoundResult) -> None:
    """Besides answers, the bot sent only "your previous question is still running" notices and the /help text."""
    notices = {text("queued", "en"), text("queued", "zh")}
    helps = {text("help", "en"), text("help", "zh")}
    questions = {(q.chat_id, q.message_id) for q in result.questions}
    others = [d for d in result.deliveries if not d.is_answer]
    strays = [d.text[:60] for d in others if d.text not in notices | helps]
    assert not strays, f"unexpected messages (apologies?): {strays[:5]}"
    noticed = Counter((d.chat_id, d.reply_to) for d in others if d.text in notices)
    assert set(noticed) <= questions and max(noticed.values(), default=1) == 1
    chatter = {(c.chat_id, c.message_id) for c in result.chatter}
    assert not chatter & {(d.chat_id, d.reply_to) for d in result.deliveries}, "the bot answered group chatter"


def check_help(result: RoundResult) -> None:
    """/help in the busiest group, sent once half the questions are answered, is answered before the turns end.

    The /help queued halfway through the burst gets its one reply too; its time is the intake's (it waits for
    the ~300 updates before it to be fetched and journaled), a throughput figure bench/bench_load.py reports.
    """
    for asked in result.helps.values():
        replies = result.replies_to(asked)
        assert len(replies) == 1 and "/ask" in replies[0].text
    # Not queued behind the turns: answered while questions asked before it were still waiting for theirs.
    help_at = result.replies_to(result.helps["mid-run"])[0].at
    answers_after = [d for d in result.deliveries if d.text.startswith(ANSWER_PREFIX) and d.at > help_at]
    assert answers_after, "the mid-run /help waited for every question's answer"


def check_model(result: RoundResult) -> None:
    """The model was called exactly as the questions need, and never saw the chatter."""
    assert result.model_requests == model_calls_of(result.questions)
    assert result.chatter and not {c.tag for c in result.chatter} & result.tags_seen_by_model


def expected_answer(question: Sent) -> str:
    """What the scripted model answers: the question's tag, and the lesson count course_query found."""
    return f"{ANSWER_PREFIX} {question.tag}" + (" (200 lessons)" if question.course else "")


def model_calls_of(questions: list[Sent]) -> int:
    """Two calls for a course question (the lookup, then the answer), one for any other."""
    return sum(2 if q.course else 1 for q in questions)


def questions_by_chat(questions: list[Sent]) -> dict[int, list[Sent]]:
    """The questions of each chat, in the order they were sent."""
    chats: dict[int, list[Sent]] = defaultdict(list)
    for question in questions:
        chats[question.chat_id].append(question)
    return chats


class HistoryCursor:
    """Checks each round's new history rows; remembers only where the last round's rows ended."""

    def __init__(self) -> None:
        self.last_message_id = 0
        self.turns = 0

    async def check(self, bot: RunningBot, result: RoundResult) -> None:
        """Per session: one user and one assistant row per question, in the order asked; every turn stored once."""
        # Read through the bot's own connection: a second one would start a thread per query, and threads come
        # and go with their own memory, blurring the memory measurement.
        rows = await bot.db.fetchall("SELECT id, session_id, role, content FROM messages WHERE id > ? ORDER BY id",
                                     (self.last_message_id,))
        sessions: dict[str, list[tuple[str, object]]] = defaultdict(list)
        for _, session_id, role, content in rows:
            # A question row is known by its tag: in a group it starts with the asker's name.
            sessions[session_id].append((role, QUESTION_TAG.findall(content) if role == "user" else content))
        asked = questions_by_chat(result.questions)
        assert set(sessions) == {f"tg:{chat_id}" for chat_id in asked}
        for chat_id, questions in asked.items():
            expected = [row for q in questions for row in (("user", [q.tag]), ("assistant", expected_answer(q)))]
            assert sessions[f"tg:{chat_id}"] == expected, f"history of chat {chat_id}"
        self.last_message_id = rows[-1][0]
        self.turns += len(result.questions)
        assert tuple(await bot.db.fetchone(
            "SELECT count(*), count(DISTINCT source_key) FROM turns WHERE status = 'answered'")) \
            == (self.turns, self.turns)
        assert (await bot.db.fetchone("SELECT count(*) FROM turns"))[0] == self.turns
        await all_handled(bot)


async def memory_when_idle(bot: RunningBot, crowd: Population) -> tuple[int, int]:
    """(RSS bytes, live interpreter blocks) once the client has closed its idle connections, after a full collection.

    Each kept-alive connection holds a thread of the fake server, and how many a burst leaves open varies: counted
    as they are, they would be most of the noise.
    """
    await asyncio.sleep(IDLE_CONNECTION_SECONDS)
    someone = crowd.members[crowd.chats[0].id][0]
    await bot.ask(crowd.chats[0], someone, "/help")  # a request: the pool drops the connections idle for too long
    await asyncio.sleep(0.2)  # the fake's threads see those connections close
    gc.collect()
    return rss_bytes(), sys.getallocatedblocks()


async def all_handled(bot: RunningBot, timeout: float = 60.0) -> None:
    """Wait until the journal holds no unhandled update: an update is marked handled just after its answer is
    sent, so on a busy machine the last few may lag the answers by a moment."""
    deadline = asyncio.get_running_loop().time() + timeout
    query = "SELECT count(*) FROM telegram_updates WHERE handled_at IS NULL"
    while (left := (await bot.db.fetchone(query))[0]) > 0:
        assert asyncio.get_running_loop().time() < deadline, f"{left} updates still unhandled"
        await asyncio.sleep(0.05)
