"""`qwenbot eval FILE.jsonl`: a question set through the real agent, scored, with every failure given a class.

Each line of the file is one question: `{"q": "...", "expect": [...]}` (every string must appear in the answer),
optionally `"expect_any": [...]` (at least one must) and `"expect_none": [...]` (none may). Matching ignores case
and width (NFKC), so `２００` is `200`.

Every question runs in a fresh session, all of them at once, so the local model thread batches them as it batches
real chats. The run works on a copy of the bot's database (its courses and tool settings, none of its history),
so evaluating never touches what users see. A failed question gets the first class that fits, in this order:

    timeout        the turn ran past TURN_TIMEOUT_SECONDS
    error          the backend failed
    format         a reply fit neither an action nor a final answer
    unknown_tool   the model called a tool that is not enabled
    bad_arguments  a tool call's arguments were unreadable or did not fit its schema
    no_tool_call   no tool ran (the model answered from memory, or was held to a tool call and never made one)
    wrong_answer   a tool ran, but the answer does not hold what was expected
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import unicodedata
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from agent.apologies import is_apology
from agent.errors import LLMError, LLMTimeout
from agent.loop import Agent
from agent.memory import Session
from agent.steps import TurnResult
from core.errors import BotError

FAILURES = {
    "timeout": "timeout",
    "error": "error",
    "format": "format",
    "unknown_tool": "unknown tool",
    "bad_arguments": "bad arguments",
    "no_tool_call": "no tool call",
    "wrong_answer": "tool right but answer wrong",
}
SHOWN_CHARS = 100  # of a question and of its answer, in the line `qwenbot eval` prints for it
EVAL_CHAT = "eval"  # the chat key whose tool settings a run uses (none of its own: the global ones)


class EvalFileError(BotError, ValueError):
    """A question file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class EvalCase:
    """One question and what its answer must (and must not) hold."""

    question: str
    expect: tuple[str, ...] = ()
    expect_any: tuple[str, ...] = ()
    expect_none: tuple[str, ...] = ()
    line: int = 0

    def accepts(self, answer: str) -> bool:
        """Whether `answer` holds every `expect`, one `expect_any` (if any are given) and no `expect_none`."""
        text = fold(answer)
        return (all(fold(s) in text for s in self.expect)
                and (not self.expect_any or any(fold(s) in text for s in self.expect_any))
                and not any(fold(s) in text for s in self.expect_none))


@dataclass
class CaseResult:
    """How one question went."""

    case: EvalCase
    answer: str = ""
    passed: bool = False
    failure: str | None = None  # a key of FAILURES, for a failed question
    seconds: float = 0.0
    model_calls: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class EvalReport:
    """A whole run: each question's result, and the figures over all of them."""

    results: list[CaseResult]
    seconds: float = 0.0
    about: dict[str, Any] = field(default_factory=dict)  # model, backend, mode, constraints: what was evaluated

    @property
    def passed(self) -> int:
        """How many questions were answered as expected."""
        return sum(result.passed for result in self.results)

    def failures(self) -> dict[str, int]:
        """Failed questions per class, every class listed."""
        return {name: sum(r.failure == name for r in self.results) for name in FAILURES}

    def format_steps(self) -> int:
        """Replies that broke the format, over all questions (a turn may recover from one)."""
        return sum(step["kind"] == "format_error" and step["error"] == "parse"
                   for result in self.results for step in result.steps)

    def mean(self, attribute: str) -> float:
        """The mean of a per-question figure (`seconds`, `model_calls`)."""
        return sum(getattr(r, attribute) for r in self.results) / len(self.results) if self.results else 0.0

    def as_json(self) -> dict[str, Any]:
        """The report for `--report`: the figures, then every question with its answer and steps."""
        return {**self.about, "total": len(self.results), "passed": self.passed,
                "score": round(self.passed / len(self.results), 4) if self.results else 0.0,
                "failures": self.failures(), "format_steps": self.format_steps(),
                "mean_seconds": round(self.mean("seconds"), 2), "mean_model_calls": round(self.mean("model_calls"), 2),
                "wall_seconds": round(self.seconds, 2),
                "questions": [{**asdict(r.case), **{k: v for k, v in asdict(r).items() if k != "case"}}
                              for r in self.results]}


def fold(text: str) -> str:
    """Text as answers are compared: NFKC (full-width digits and letters made plain), case folded."""
    return unicodedata.normalize("NFKC", text).casefold()


def load_cases(path: Path) -> list[EvalCase]:
    """The questions of a JSONL file; a bad line is an `EvalFileError` naming it. Blank lines are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise EvalFileError(f"cannot read {path}: {error}") from None
    cases = [_case(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not cases:
        raise EvalFileError(f"{path} holds no questions")
    return cases


def _case(path: Path, number: int, line: str) -> EvalCase:
    where = f"{path}, line {number}"
    try:
        item = json.loads(line)
    except ValueError as error:
        raise EvalFileError(f"{where}: not JSON ({error})") from None
    if not isinstance(item, dict) or not isinstance(item.get("q"), str) or not item["q"].strip():
        raise EvalFileError(f'{where}: expected {{"q": "question", "expect": [...]}}')
    unknown = set(item) - {"q", "expect", "expect_any", "expect_none"}
    if unknown:
        raise EvalFileError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    lists = {key: item.get(key, []) for key in ("expect", "expect_any", "expect_none")}
    for key, value in lists.items():
        if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
            raise EvalFileError(f"{where}: {key} must be a list of non-empty strings")
    if not lists["expect"] and not lists["expect_any"]:
        raise EvalFileError(f"{where}: give expect or expect_any, or any answer would pass")
    return EvalCase(item["q"], *(tuple(v) for v in lists.values()), line=number)


def classify(result: TurnResult) -> str:
    """The class of a turn that ended with an answer that does not hold what was expected."""
    errors = {step.error for step in result.steps}
    if "parse" in errors:
        return "format"
    if "unknown_tool" in errors:
        return "unknown_tool"
    if "invalid_arguments" in errors:
        return "bad_arguments"
    if not any(step.error is None for step in result.tool_steps):
        return "no_tool_call"
    return "wrong_answer"


async def run_case(agent: Agent, case: EvalCase, session_id: str) -> CaseResult:
    """One question in a fresh session; a failing backend is a result, not an exception."""
    started = time.perf_counter()
    outcome = CaseResult(case)
    try:
        turn = await agent.run(Session(id=session_id, chat_key=EVAL_CHAT, kind="eval"), case.question)
    except LLMTimeout:
        outcome.failure = "timeout"
    except LLMError as error:
        outcome.failure, outcome.answer = "error", f"({error})"
    else:
        outcome.answer, outcome.model_calls = turn.answer, turn.model_calls
        outcome.steps = [{"kind": s.kind, "action": s.action, "action_input": s.action_input, "error": s.error}
                         for s in turn.steps]
        # An apology is no answer, even when it happens to hold an expected word ("could not" for "not ").
        outcome.passed = not is_apology(turn.answer) and case.accepts(turn.answer)
        outcome.failure = None if outcome.passed else classify(turn)
    outcome.seconds = time.perf_counter() - started
    return outcome


async def evaluate(agent: Agent, cases: Sequence[EvalCase]) -> EvalReport:
    """Every case at once, each in its own fresh session."""
    run = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    results = await asyncio.gather(*(run_case(agent, case, f"eval:{run}:{n}") for n, case in enumerate(cases, 1)))
    return EvalReport(list(results), time.perf_counter() - started)


def copy_database(source: Path, target: Path) -> None:
    """Copy the bot's database with SQLite's backup API (consistent while the bot runs); none: nothing to copy."""
    if not source.exists():
        return
    with sqlite3.connect(f"file:{source}?mode=ro", uri=True) as reader, sqlite3.connect(target) as writer:
        reader.backup(writer)


def summary(report: EvalReport, source: str) -> list[str]:
    """The lines `qwenbot eval` prints: one per question, then the score, the failure classes and the means."""
    lines = [_question_line(result) for result in report.results]
    total = len(report.results)
    about = ", ".join(f"{key} {value}" for key, value in report.about.items())
    lines += ["", f"{source}: {total} questions ({about})",
              f"score: {report.passed}/{total} ({report.passed / total:.0%})",
              "failures: " + ", ".join(f"{FAILURES[name]} {count}" for name, count in report.failures().items()),
              f"replies that broke the format: {report.format_steps()}",
              f"per question: {report.mean('seconds'):.1f} s, {report.mean('model_calls'):.1f} model calls "
              f"(all {total} at once: {report.seconds:.0f} s)"]
    return lines


def _question_line(result: CaseResult) -> str:
    """One question's line: its mark, the question and the answer, each cut to SHOWN_CHARS (a question set may hold
    a 10 MB question; the report file, not the terminal, is the place for all of it)."""
    mark = "✓" if result.passed else f"✗ {FAILURES[result.failure or 'error']}:"
    return f"{mark} {shown(result.case.question)} → {shown(result.answer)}"


def shown(text: str) -> str:
    """`text` on one line, cut to SHOWN_CHARS characters with … when longer."""
    # Only the start is split into words: a megabyte is not worth splitting to show a hundred characters of it.
    flat = " ".join(text[:SHOWN_CHARS * 4].split())
    longer = len(flat) > SHOWN_CHARS or len(text) > SHOWN_CHARS * 4
    return flat[:SHOWN_CHARS] + ("…" if longer else "")
