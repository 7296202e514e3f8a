"""The benchmark's workload: distinct course questions, answered by full ReAct turns through the real agent.

The offline test model (SmolLM2-135M) cannot follow the ReAct format, so `ScriptedReact` wraps the backend under
test: every call runs a **real generation** of exactly `new_tokens` tokens on the agent's real prompt (real cost,
real token counts, whatever the model writes, greedy), and then hands the agent a scripted Qwen-shaped reply that
fits the question: first an Action (`course_query` for the course asked about, or `course_list`), then the Final
Answer. Every turn therefore takes the same path, two model calls, through the real agent loop, prompt rendering,
history, tool registry, course tools and SQLite database, whatever engine runs the model, and every engine sees the
same prompts. Questions are numbered, so each one is distinct: no prompt of a run repeats an earlier one whole.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from agent.conversations import start_conversation
from agent.events import TurnEvent
from agent.grammar import Grammar
from agent.llm.base import LLM, Completion, Message, ModelRequest
from agent.loop import Agent, Session
from tools.registry import Tool

# The four courses the database is seeded with (migrations/0003_courses.sql): lessons, updates/week, hours.
COURSES = {"大模型技术实战": (200, 3, 2), "机器学习实战": (230, 2, 1.5), "深度学习实战": (150, 1, 3),
           "AI数据分析": (10, 1, 1)}
PHRASINGS = (
    "请帮我查一下：{course}课程目前一共上线了多少节？我是学员{n}号。",
    "我是学员{n}号，想知道{course}每周更新几次？",
    "学员{n}号提问：{course}每次更新多少小时？",
    "{course}这门课现在有多少课时？（{n}号学员）",
    "我是学员{n}号，你们一共有哪些课程？每门多少节？",  # answered from course_list
)


@dataclass(frozen=True)
class Question:
    """One question and the scripted replies that answer it through a tool."""

    n: int
    text: str
    course: str | None  # None: the question is about every course (course_list)

    @property
    def action_reply(self) -> str:
        """The first call's reply: call the tool that answers the question."""
        if self.course is None:
            return "Thought: 我需要列出所有课程。\nAction: course_list\nAction Input: {}\n"
        arguments = json.dumps({"course_name": self.course}, ensure_ascii=False)
        return f"Thought: 我需要查询{self.course}的课程信息。\nAction: course_query\nAction Input: {arguments}\n"

    @property
    def final_answer(self) -> str:
        """What the turn answers, from the seeded numbers."""
        if self.course is None:
            return "目前有" + "、".join(f"{name}（{lessons}节）" for name, (lessons, _, _) in COURSES.items()) + "。"
        lessons, per_week, hours = COURSES[self.course]
        return f"{self.course}目前一共上线了{lessons}节，每周更新{per_week}次，每次{hours:g}小时。"

    @property
    def final_reply(self) -> str:
        """The second call's reply (the trace ends with `Thought:`, so it goes on from there)."""
        return f" I now know the final answer\nFinal Answer: {self.final_answer}"


def question(n: int) -> Question:
    """Question number `n`: the course and phrasing cycle, the number makes the text distinct."""
    phrasing = PHRASINGS[(n // len(COURSES)) % len(PHRASINGS)]
    course = None if "哪些课程" in phrasing else list(COURSES)[n % len(COURSES)]
    return Question(n, phrasing.format(course=course, n=n), course)


@dataclass(frozen=True)
class CallRecord:
    """One model call as the bench saw it."""

    question: int
    prompt_tokens: int
    reused_tokens: int
    completion_tokens: int
    seconds: float


class ScriptedReact(LLM):
    """Real fixed-length generation through `inner`, then the scripted ReAct reply for the call's question."""

    name = "scripted-react"

    def __init__(self, inner: LLM, new_tokens: int, grammar: bool = False):
        self.inner = inner
        self.new_tokens = new_tokens
        self.grammar = grammar  # generate under the agent's step grammar, made repeatable (see `endless`)
        self.calls: list[CallRecord] = []
        self.prompts: list[list[Message]] = []  # every prompt sent, for the raw ceiling
        self.start_seconds = 0.0
        self._questions: dict[str, Question] = {}

    def expect(self, questions: Sequence[Question]) -> None:
        """Make `questions` known, so each call can be matched to the one it is about."""
        self._questions.update((q.text, q) for q in questions)

    async def start(self) -> None:
        """Start the wrapped backend, timing it."""
        started = time.perf_counter()
        await self.inner.start()
        self.start_seconds = time.perf_counter() - started

    async def close(self) -> None:
        """Close the wrapped backend."""
        await self.inner.close()

    def count_tokens(self, text: str) -> int:
        """The wrapped backend's count."""
        return self.inner.count_tokens(text)

    async def complete(self, request: ModelRequest) -> Completion:
        """Generate `new_tokens` real tokens for the request's messages (no stop strings; streamed to its `on_text`
        when a turn listens; under the step grammar when the contender measures it), then answer with the script."""
        messages, grammar = request.messages, request.grammar
        asked = self._question_of(messages)
        started = time.perf_counter()
        constraint = endless(grammar) if self.grammar and grammar is not None else None
        real = await self.inner.complete(ModelRequest(messages, tools=request.tools, grammar=constraint,
                                                      max_new_tokens=self.new_tokens, cancel=request.cancel,
                                                      on_text=request.on_text, user_key=request.user_key,
                                                      priority=request.priority))
        self.calls.append(CallRecord(asked.n, real.prompt_tokens, real.cached_tokens, real.completion_tokens,
                                     time.perf_counter() - started))
        self.prompts.append(list(messages))
        continuing = messages[-1]["role"] == "assistant"  # the trace already holds the Observation
        reply = asked.final_reply if continuing else asked.action_reply
        return Completion(reply, real.prompt_tokens, real.completion_tokens, cached_tokens=real.cached_tokens)

    def _question_of(self, messages: Sequence[Message]) -> Question:
        """The question being answered: the one the last user message asks (history holds earlier ones)."""
        asked = next(str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "user")
        matching = [known for text, known in self._questions.items() if text in asked]
        if not matching:
            raise SystemExit(f"bench: a model call about no expected question: {asked[-200:]!r}")
        return max(matching, key=lambda known: len(known.text))


class InstantLLM(LLM):
    """A backend that generates nothing, at once: with `ScriptedReact` around it, it records the prompts a run
    sends without running a model (the raw ceiling replays them through `generate`)."""

    name = "instant"

    def __init__(self, count_tokens: Any):
        self._count = count_tokens

    def count_tokens(self, text: str) -> int:
        """The given counter's count."""
        return self._count(text)

    async def complete(self, request: ModelRequest) -> Completion:
        """Nothing, now."""
        return Completion("", 0, request.max_new_tokens)


def endless(grammar: Grammar) -> Grammar:
    """The step grammar made repeatable (`start: step+`): a fixed-length call must not reach the grammar's end,
    where only the end-of-turn token (banned here) would be allowed; so every token stays masked."""
    return Grammar(grammar.kind, grammar.lark.replace("start: ", "start: step+\nstep: ", 1))


@dataclass
class TurnsResult:
    """What one round of chats did: every turn's latency and how long it all took."""

    seconds: float
    latencies: list[float] = field(default_factory=list)


class Listener:
    """What Telegram and the terminal do with a turn's events, minus the output: note them."""

    def __init__(self) -> None:
        self.events = 0

    def __call__(self, event: TurnEvent) -> None:
        self.events += 1


async def one_turn(agent: Agent, session: Session, asked: Question, listen: bool = False) -> float:
    """Run one turn (with a listener, so that it streams, when `listen`) and check it took the scripted path
    (tool, then answer); return its latency in seconds."""
    started = time.perf_counter()
    result = await agent.run(session, asked.text, on_event=Listener() if listen else None)
    seconds = time.perf_counter() - started
    kinds = [str(step.kind) for step in result.steps]
    expected = asked.course or "大模型技术实战"  # course_list lists them all
    if kinds != ["tool", "final"] or expected not in (result.steps[0].observation or "") \
            or result.answer != asked.final_answer:
        raise SystemExit(f"bench: turn {asked.n} took an unexpected path: {kinds} {result.steps} {result.answer!r}")
    return seconds


async def chat(agent: Agent, session: Session, questions: Sequence[Question], latencies: list[float],
               listen: bool = False) -> None:
    """One chat: its questions one after another, as a user asks them."""
    for asked in questions:
        latencies.append(await one_turn(agent, session, asked, listen))


async def run_chats(agent: Agent, llm: ScriptedReact, plan: dict[str, list[Question]],
                    listen: bool = False) -> TurnsResult:
    """Every chat of `plan` (session id → its questions) at once; each chat's turns in order."""
    llm.expect([q for questions in plan.values() for q in questions])
    latencies: list[float] = []
    started = time.perf_counter()
    await asyncio.gather(*(chat(agent, Session(id=key, chat_key="bench"), questions, latencies, listen)
                           for key, questions in plan.items()))
    return TurnsResult(time.perf_counter() - started, latencies)


def first_prompt(asked: Question, tools: Sequence[Tool]) -> list[Message]:
    """The agent's first ReAct prompt for `asked` in a new chat (no history)."""
    return start_conversation("react", [], asked.text, tools).request().messages


@dataclass
class ProbeResult:
    """First-token probes sent while other chats were generating."""

    latencies: list[float]
    background_seconds: float
    background_tokens: int
    probe_tokens: list[int]


async def probe_first_token(llm: LLM, background: Sequence[list[Message]], probes: Sequence[list[Message]],
                            tokens: int, gap: float) -> ProbeResult:
    """Start `tokens`-token generations for `background`; while they run, every `gap` seconds send the next probe
    (a 1-token call) and time it until it is answered. Without streaming, a 1-token call's completion time is the
    time to its first token: its wait to join, its prompt, one step."""
    started, ended = time.perf_counter(), []
    running = asyncio.ensure_future(asyncio.gather(*(llm.complete(ModelRequest(m, max_new_tokens=tokens))
                                                     for m in background)))
    running.add_done_callback(lambda _: ended.append(time.perf_counter()))
    latencies, probe_tokens = [], []
    for messages in probes:
        await asyncio.wait({running}, timeout=gap)
        if running.done():
            break
        sent = time.perf_counter()
        answer = await llm.complete(ModelRequest(messages, max_new_tokens=1))
        latencies.append(time.perf_counter() - sent)
        probe_tokens.append(answer.completion_tokens)
    done = await running
    return ProbeResult(latencies, ended[0] - started, sum(c.completion_tokens for c in done),
                       probe_tokens)
