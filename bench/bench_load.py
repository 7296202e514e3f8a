"""Load benchmark: many users in many chats asking at once; answers per second, answer latency, peak memory.

    .venv/bin/python bench/bench_load.py             # 100 users, 20 chats, 5 questions each, 30 ms per model call;
                                                     # then the same with an instant model, and in one group chat
    .venv/bin/python bench/bench_load.py --users 100 --chats 20 --messages 5 --model-delay 0.03 --no-compare
    .venv/bin/python bench/bench_load.py --repeat 3  # each load three times, the median run shown

Everything is the real bot (bot/telegram/app.py's application, the update journal, turn order, handlers, the agent, the
SQLite file) but two things. Telegram is the fake Bot API server of tests/fakes/telegram_server.py, over real HTTP
on 127.0.0.1, in this process (its threads share the interpreter with the bot, so the figures are a lower bound
for the bot alone). The model is a `ScriptedLLM` that answers each question by its tag after
`--model-delay` seconds per call, looking the course up with `course_query` first when asked about one. Its
delays overlap across chats: a stand-in for a model that batches the pending calls of all chats (the local
backend's one model thread, up to BATCH_SIZE rows per `generate`, or a vLLM server), not for one that answers a
single call at a time.

Half the chats are private (one user each); the other users share the group chats, where questions are addressed
(`/ask …` or `@bot …`) among chatter the bot must ignore. Every message of a round is queued on the fake server at
once, interleaved across chats, so the burst arrives as fast as `getUpdates` can hand it over. Telegram's own
rate limits (30 messages a second, 20 a minute per group) are lifted: the fake does not enforce them, and with
them the figures would measure Telegram's limits, not the bot.

Latency runs from the moment an update is queued on the fake server to the moment the server accepts the
`sendMessage` that answers it; in a burst it is mostly waiting in line behind the same chat's earlier questions.
Someone in the busiest group sends /help twice: queued halfway through the burst (its time is mostly the intake
of the ~300 updates before it) and once half the questions are answered (the bot at its busiest). Peak memory is
this process's RSS (bot, fake server and all), sampled every 50 ms. A warm-up round of one question per user
comes first.

tests/test_load.py runs the same load and checks every answer, the history and the memory.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import psutil  # noqa: E402  (the test extra)

from agent.llm.scripted import Request, ScriptedLLM  # noqa: E402
from bot.program.config import Settings  # noqa: E402
from tests.fakes.telegram_bot import RunningBot, running_bot  # noqa: E402
from tests.fakes.telegram_server import ApiCall, Chat, FakeTelegramServer, User, group_chat, private_chat  # noqa: E402

FIRST_USER_ID = 10_000
FIRST_GROUP_ID = -1_002_000_000_000
COURSE_QUESTION = "大模型技术实战课程一共上线了多少节？"
PLAIN_QUESTION = "what is on the agenda today?"
ANSWER_PREFIX = "Answer to"
QUESTION_TAG = re.compile(r"\bQ\d+-c\d+-u\d+-m\d+\b")
ANY_TAG = re.compile(r"\b[QC]\d+-c\d+-u\d+-m\d+\b")
CHATTER_AFTER = 1  # in groups, each user's chatter line follows their question of this index
LOOKUP = ("Thought: I should look the course up.\nAction: course_query\n"
          'Action Input: {"course_name": "大模型技术实战"}\nObservation:')


# --- who talks where ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Population:
    """The chats of the load and who writes in each."""

    chats: list[Chat]
    members: dict[int, list[User]]  # chat id → its users, in the order they write

    @property
    def private_user_ids(self) -> frozenset[int]:
        """Users with a private chat: allowed by ALLOWED_USER_IDS."""
        return frozenset(c.id for c in self.chats if c.type == "private")

    @property
    def group_ids(self) -> frozenset[int]:
        """The group chats: allowed by ALLOWED_CHAT_IDS (everyone in them may ask)."""
        return frozenset(c.id for c in self.chats if c.type != "private")

    def busiest_group(self) -> Chat:
        """The group with the most members (the one with the longest line), or the first chat."""
        groups = [c for c in self.chats if c.type != "private"] or self.chats
        return max(groups, key=lambda chat: len(self.members[chat.id]))


def population(users: int, chats: int) -> Population:
    """`users` people in `chats` chats: half the chats private (one user each), the others groups sharing the rest."""
    privates = 0 if chats == 1 else chats // 2
    groups = chats - privates
    if users < privates + groups:
        raise ValueError(f"{users} users cannot fill {chats} chats")
    people = [User(FIRST_USER_ID + i, f"User{i}", "zh" if i % 2 else "en", username=f"user{i}")
              for i in range(users)]
    private_chats = [private_chat(person) for person in people[:privates]]
    group_chats = [group_chat(FIRST_GROUP_ID - g, f"Team {g}") for g in range(groups)]
    members = {chat.id: [person] for chat, person in zip(private_chats, people)}
    for g, chat in enumerate(group_chats):
        members[chat.id] = people[privates + g::groups]
    return Population(private_chats + group_chats, members)


@dataclass(frozen=True)
class Outgoing:
    """A message a simulated user is about to send."""

    chat: Chat
    user: User
    text: str
    tag: str
    addressed: bool
    course: bool = False


def round_messages(crowd: Population, round_no: int, messages: int, bot_username: str) -> list[Outgoing]:
    """Every user's `messages` questions (plus chatter in groups), interleaved across chats and users."""
    out: list[Outgoing] = []
    deepest = max(len(members) for members in crowd.members.values())
    for m in range(messages):
        for depth in range(deepest):
            for c, chat in enumerate(crowd.chats):
                members = crowd.members[chat.id]
                if depth < len(members):
                    out.append(question(chat, members[depth], f"Q{round_no}-c{c}-u{depth}-m{m}", m, bot_username))
                    if chat.type != "private" and m == CHATTER_AFTER:
                        out.append(chatter(chat, members[depth], f"C{round_no}-c{c}-u{depth}-m{m}", depth))
    return out


def question(chat: Chat, user: User, tag: str, m: int, bot_username: str) -> Outgoing:
    """An addressed question; odd ones ask about a course. Groups alternate `/ask` and an @mention."""
    course = m % 2 == 1
    body = f"{COURSE_QUESTION if course else PLAIN_QUESTION} ({tag})"
    if chat.type != "private":
        body = f"/ask {body}" if (m + user.id) % 2 == 0 else f"@{bot_username} {body}"
    return Outgoing(chat, user, body, tag, True, course)


def chatter(chat: Chat, user: User, tag: str, depth: int) -> Outgoing:
    """Group talk the bot must ignore: plain text, a mention of another bot, a command for another bot."""
    forms = [f"lunch at noon? ({tag})", f"@other_bot what time is it? ({tag})", f"/ask@other_bot the time? ({tag})"]
    return Outgoing(chat, user, forms[depth % len(forms)], tag, False)


# --- the model ---------------------------------------------------------------------------------------------------

def answer_by_tag(request: Request) -> str:
    """The scripted model: a course question gets a course_query first; every answer names its question's tag."""
    asked = next(m for m in reversed(request.messages) if m["role"] == "user")["content"]
    tag = QUESTION_TAG.findall(asked)[-1]
    last = request.messages[-1]
    trace = str(last["content"]) if last["role"] == "assistant" else ""
    if COURSE_QUESTION in asked and "Observation:" not in trace:
        return LOOKUP
    found = " (200 lessons)" if "200" in trace else ""
    return f"Thought: I now know the final answer\nFinal Answer: {ANSWER_PREFIX} {tag}{found}"


def model_calls(outgoing: Sequence[Outgoing]) -> int:
    """How many model calls the questions take: two for a course question (lookup, answer), one otherwise."""
    return sum(2 if o.course else 1 for o in outgoing if o.addressed)


# --- running a round ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sent:
    """A message a simulated user sent, and when it was queued on the fake server."""

    chat_id: int
    user_id: int
    message_id: int
    tag: str
    addressed: bool
    course: bool
    at: float  # time.monotonic()


@dataclass(frozen=True)
class Delivery:
    """A message the fake server accepted from the bot."""

    chat_id: int
    reply_to: int | None
    text: str
    at: float  # time.monotonic()

    @classmethod
    def of(cls, call: ApiCall) -> "Delivery":
        """The compact form of an accepted sendMessage call."""
        reply = call.params.get("reply_parameters") or {}
        return cls(int(call.params["chat_id"]), reply.get("message_id"), call.result["text"], call.at)

    @property
    def is_answer(self) -> bool:
        """Whether this is the model's answer (not a queued notice, /help or an apology)."""
        return self.text.startswith(ANSWER_PREFIX)


@dataclass
class RoundResult:
    """What a round sent and what came back."""

    questions: list[Sent]
    chatter: list[Sent]
    helps: dict[str, Sent]  # "in burst": queued halfway through the burst; "mid-run": sent once half is answered
    deliveries: list[Delivery]  # in the order the fake server accepted them
    model_requests: int
    tags_seen_by_model: set[str]

    def answers(self) -> list[Delivery]:
        """The model's answers, in arrival order."""
        return [d for d in self.deliveries if d.is_answer]

    def latencies(self) -> list[float]:
        """Seconds from each question's update being queued to its (first) answer being accepted."""
        first: dict[tuple[int, int | None], float] = {}
        for answer in self.answers():
            first.setdefault((answer.chat_id, answer.reply_to), answer.at)
        return [first[(q.chat_id, q.message_id)] - q.at for q in self.questions if (q.chat_id, q.message_id) in first]

    def replies_to(self, message: Sent) -> list[Delivery]:
        """Everything the bot sent in reply to `message`."""
        return [d for d in self.deliveries if (d.chat_id, d.reply_to) == (message.chat_id, message.message_id)]

    def help_seconds(self, when: str) -> float:
        """Seconds from a /help being queued to its reply being accepted."""
        return self.replies_to(self.helps[when])[0].at - self.helps[when].at

    @property
    def seconds(self) -> float:
        """From the first question queued to the last answer accepted."""
        return max(a.at for a in self.answers()) - min(q.at for q in self.questions)


async def start_load_bot(server: FakeTelegramServer, folder: Path, crowd: Population, model_delay: float,
                         **overrides: Any) -> RunningBot:
    """The real bot against `server`, every chat of `crowd` allowed, Telegram's rate limits lifted, history summaries
    off: every model call is a question's, as the rounds script and count them (bench_summaries.py measures what
    summaries cost beside the chats)."""
    llm = ScriptedLLM(delay=model_delay)
    return await running_bot(server, folder, llm=llm, allowed_user_ids=crowd.private_user_ids,
                             allowed_chat_ids=crowd.group_ids, telegram_messages_per_second=0,
                             telegram_group_messages_per_minute=0, **{"summary_enabled": False, **overrides})


async def run_round(bot: RunningBot, crowd: Population, round_no: int, messages: int, *,
                    helps: bool = False, timeout: float | None = None) -> RoundResult:
    """Queue every message of a round at once and wait for every answer. With `helps`, someone in the busiest group
    sends /help twice: queued halfway through the burst, and once half the questions are answered."""
    server, llm = bot.server, bot.llm
    server.forget()  # what came before is not this round's
    outgoing = round_messages(crowd, round_no, messages, server.bot.username or "")
    llm.add(*[answer_by_tag] * model_calls(outgoing))
    busiest = crowd.busiest_group()
    help_message = Outgoing(busiest, crowd.members[busiest.id][0], "/help", "help", False)
    sent, help_sent = [], {}
    for index, message in enumerate(outgoing):
        if helps and index == len(outgoing) // 2:
            help_sent["in burst"] = push(server, help_message)
        sent.append(push(server, message))
    questions = [s for s in sent if s.addressed]
    limit = timeout or 60 + len(questions) * (2 * llm.delay + 0.05)
    if helps:
        await wait_for_answers(server, len(questions) // 2, limit)
        help_sent["mid-run"] = push(server, help_message)
    await wait_for_answers(server, len(questions), limit)
    await server.settle(0.3)  # a duplicate or a late stray message would land now
    result = RoundResult(questions, [s for s in sent if not s.addressed], help_sent,
                         [Delivery.of(call) for call in server.sent()], len(llm.requests), tags_seen(llm))
    llm.requests.clear()  # the scripted model's record, not the bot's memory
    server.forget()
    return result


def push(server: FakeTelegramServer, message: Outgoing) -> Sent:
    """Queue one message on the fake server; it is available to getUpdates from now on."""
    message_id = server.send_text(message.chat, message.user, message.text)
    return Sent(message.chat.id, message.user.id, message_id, message.tag, message.addressed, message.course,
                time.monotonic())


async def wait_for_answers(server: FakeTelegramServer, count: int, timeout: float) -> None:
    """Wait until the fake server has accepted `count` answers (checked every 50 ms, to leave the CPU to the bot)."""
    deadline = time.monotonic() + timeout
    while (got := sum(1 for call in server.sent() if call.result["text"].startswith(ANSWER_PREFIX))) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out: {got} of {count} answers after {timeout:.0f} s")
        await asyncio.sleep(0.05)


def tags_seen(llm: ScriptedLLM) -> set[str]:
    """Every question or chatter tag in any prompt the model was given."""
    return {tag for request in llm.requests for tag in ANY_TAG.findall(request.text)}


# --- memory ------------------------------------------------------------------------------------------------------

def rss_bytes() -> int:
    """This process's resident memory."""
    return psutil.Process().memory_info().rss


@contextlib.asynccontextmanager
async def peak_rss(every: float = 0.05) -> AsyncIterator[list[int]]:
    """Sample RSS in the background; the yielded list holds the peak (one item) once the block ends."""
    peak = [rss_bytes()]

    async def sample() -> None:
        while True:
            peak[0] = max(peak[0], rss_bytes())
            await asyncio.sleep(every)

    sampler = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        sampler.cancel()
        peak[0] = max(peak[0], rss_bytes())


# --- the benchmark -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    """One load to measure."""

    name: str
    users: int
    chats: int
    messages: int
    model_delay: float


@dataclass(frozen=True)
class Figures:
    """What one scenario measured."""

    scenario: Scenario
    answers: int
    seconds: float
    latencies: list[float]
    model_calls: int
    peak_rss: int
    help_in_burst: float
    help_mid_run: float

    @property
    def per_second(self) -> float:
        """Answers per second over the whole burst."""
        return self.answers / self.seconds

    def percentile(self, p: float) -> float:
        """The latency below which `p` percent of answers came (nearest rank)."""
        ordered = sorted(self.latencies)
        return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered)) - 1))]


async def measure(scenario: Scenario, warmup_messages: int) -> Figures:
    """Run one scenario on a fresh bot, fake server and database; a small warm-up round first."""
    crowd = population(scenario.users, scenario.chats)
    production = Settings()  # progress and typing as in production, not the tests' quick timings
    with tempfile.TemporaryDirectory() as folder, FakeTelegramServer() as server:
        # Each user queues all their questions at once: the pending cap (MAX_PENDING_QUESTIONS) must let them.
        bot = await start_load_bot(server, Path(folder), crowd, scenario.model_delay,
                                   progress_after_seconds=production.streaming.progress_after_seconds,
                                   typing_interval_seconds=production.streaming.typing_interval_seconds,
                                   max_pending_questions=max(production.turns.max_pending_questions, scenario.messages))
        try:
            if warmup_messages:
                await run_round(bot, crowd, 0, warmup_messages)
            async with peak_rss() as peak:
                result = await run_round(bot, crowd, 1, scenario.messages, helps=True)
        finally:
            await bot.stop()
    if len(result.answers()) != len(result.questions):
        raise AssertionError(f"{len(result.answers())} answers for {len(result.questions)} questions")
    return Figures(scenario, len(result.questions), result.seconds, result.latencies(), result.model_requests,
                   peak[0], result.help_seconds("in burst"), result.help_seconds("mid-run"))


def scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The load as given, and unless --no-compare the same load with an instant model and in one chat."""
    given = Scenario("as given", args.users, args.chats, args.messages, args.model_delay)
    if args.no_compare:
        return [given]
    return [given,
            Scenario("model delay 0", args.users, args.chats, args.messages, 0.0),
            Scenario("1 chat (one group)", args.users, 1, args.messages, args.model_delay)]


def table(rows: Sequence[Figures]) -> str:
    """A Markdown table of the figures, with each row's throughput relative to the first."""
    lines = ["| load | users | chats | answers | model calls | delay/call | seconds | answers/s | vs first "
             "| p50 s | p95 s | p99 s | /help in burst s | /help mid-run s | peak RSS MiB |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: |"]
    for row in rows:
        s = row.scenario
        lines.append(f"| {s.name} | {s.users} | {s.chats} | {row.answers} | {row.model_calls} | "
                     f"{s.model_delay * 1000:g} ms | {row.seconds:.2f} | {row.per_second:.0f} | "
                     f"{row.per_second / rows[0].per_second:.2f}× | {row.percentile(50):.2f} | "
                     f"{row.percentile(95):.2f} | {row.percentile(99):.2f} | {row.help_in_burst:.2f} | "
                     f"{row.help_mid_run:.2f} | {row.peak_rss / 2**20:.0f} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--chats", type=int, default=20, help="half private (one user each), half groups")
    parser.add_argument("--messages", type=int, default=5, help="questions per user")
    parser.add_argument("--model-delay", type=float, default=0.03, help="seconds per scripted model call")
    parser.add_argument("--warmup-messages", type=int, default=1, help="questions per user before measuring")
    parser.add_argument("--no-compare", action="store_true", help="only the load as given")
    parser.add_argument("--repeat", type=int, default=1, help="runs per load; the table shows the median run")
    args = parser.parse_args(argv)
    if args.users < args.chats or min(args.users, args.chats, args.messages) < 1:
        parser.error("every chat needs a user, and every user a message")
    return args


async def bench(args: argparse.Namespace) -> list[Figures]:
    """Measure every scenario in turn, in this one process; of repeated runs, keep the median by throughput."""
    rows = []
    for scenario in scenarios(args):
        runs = sorted([await measure(scenario, args.warmup_messages) for _ in range(max(1, args.repeat))],
                      key=lambda figures: figures.per_second)
        rows.append(runs[len(runs) // 2])
        print(f"measured: {scenario.name}: " + ", ".join(f"{run.per_second:.0f}/s" for run in runs), file=sys.stderr)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    args = parse_args(argv)
    started = time.perf_counter()
    rows = asyncio.run(bench(args))
    print(table(rows))
    print(f"\n({time.perf_counter() - started:.0f} s in all; python {sys.version.split()[0]}, "
          f"{psutil.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
