"""`qwenbot eval FILE.jsonl`: a question set through the real agent, scored, with every failure given a class.

Each line of the file is one question: `{"q": "...", "expect": [...]}` (every string must appear in the answer),
optionally `"expect_any": [...]` (at least one must), `"expect_none": [...]` (none may) and `"kind": "..."` (what
the question needs, for the figures per kind: `lookup` is a single lookup). Matching ignores case and width
(NFKC), so `２００` is `200`; an expected number matches only a whole number of that value ("10" is not in "100",
"2" is not in "2022-01-01", "1.5" is "1.50", "2" is "两次" or "two"), other text matches as a substring.

Every question runs in a fresh session, all of them at once, so the local model thread batches them as it batches
real chats. The run works on a copy of the bot's database (its courses and tool settings, none of its history),
so evaluating never touches what users see. A failed question gets the first class that fits, in this order:

    timeout        the turn ran past TURN_TIMEOUT_SECONDS
    error          the backend failed
    format         a reply fit neither an action nor a final answer
    garbage        the answer loops, echoes the prompt or the question, or is no answer at all (agent/garbage.py)
    ungrounded     the answer has a number that no observation, nor the question, holds (agent/grounding.py)
    unknown_tool   the model called a tool that is not enabled
    bad_arguments  a tool call's arguments were unreadable or did not fit its schema
    no_tool_call   no tool ran (the model answered from memory, or was held to a tool call and never made one)
    honest_unknown a tool ran, and the bot said it could not confirm the answer (or apologised)
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

from agent.apologies import is_apology, is_honest_unknown
from agent.arguments import read_arguments
from agent.errors import LLMError, LLMTimeout
from agent.garbage import clean_answer
from agent.grounding import Grounds
from agent.loop import Agent
from agent.memory import Session
from agent.numbers import as_number, numbers_in
from agent.steps import TOOL_KINDS, StepKind
from core.errors import BotError
from tools.registry import ToolRegistry

FAILURES = {
    "timeout": "timeout",
    "error": "error",
    "format": "format",
    "garbage": "garbage",
    "ungrounded": "ungrounded",
    "unknown_tool": "unknown tool",
    "bad_arguments": "bad arguments",
    "no_tool_call": "no tool call",
    "honest_unknown": "honest unknown",
    "wrong_answer": "tool right but answer wrong",
}
SHOWN_CHARS = 100  # of a question and of its answer, in the line `qwenbot eval` prints for it
EVAL_CHAT = "eval"  # the chat key whose tool settings a run uses (none of its own: the global ones)
SINGLE_LOOKUP = "lookup"  # the kind of a question one lookup answers
FIELDS = ("q", "expect", "expect_any", "expect_none", "kind")


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
    kind: str = ""

    def accepts(self, answer: str) -> bool:
        """Whether `answer` holds every `expect`, one `expect_any` (if any are given) and no `expect_none`."""
        return (all(holds(answer, s) for s in self.expect)
                and (not self.expect_any or any(holds(answer, s) for s in self.expect_any))
                and not any(holds(answer, s) for s in self.expect_none))


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

    def kinds(self) -> dict[str, dict[str, float]]:
        """Per kind of question: how many, how many right, the most and the mean model calls."""
        figures: dict[str, dict[str, float]] = {}
        for kind in dict.fromkeys(r.case.kind for r in self.results if r.case.kind):
            results = [r for r in self.results if r.case.kind == kind]
            figures[kind] = {"total": len(results), "passed": sum(r.passed for r in results),
                             "max_model_calls": max(r.model_calls for r in results),
                             "mean_model_calls": round(sum(r.model_calls for r in results) / len(results), 2)}
        return figures

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
                "failures": self.failures(), "kinds": self.kinds(), "format_steps": self.format_steps(),
                "mean_seconds": round(self.mean("seconds"), 2), "mean_model_calls": round(self.mean("model_calls"), 2),
                "wall_seconds": round(self.seconds, 2),
                "questions": [{**asdict(r.case), **{k: v for k, v in asdict(r).items() if k != "case"}}
                              for r in self.results]}


def fold(text: str) -> str:
    """Text as answers are compared: NFKC (full-width digits and letters made plain), case folded."""
    return unicodedata.normalize("NFKC", text).casefold()


def holds(answer: str, expected: str) -> bool:
    """Whether `answer` holds `expected`: a number as a whole number of that value (in digits or words, never a
    part of a longer number or of a date), anything else as a substring."""
    number = as_number(expected)
    if number is None:
        return fold(expected) in fold(answer)
    return any(mention.value == number for mention in numbers_in(answer, words=True) if mention.kind != "date")


def load_cases(path: Path) -> list[EvalCase]:
    """The questions of a JSONL file; a bad line is an `EvalFileError` naming it. Blank lines are skipped."""
    return [_case(line.where, line.number, line.item) for line in jsonl_lines(path)]


@dataclass(frozen=True)
class JsonLine:
    """One parsed line of a JSONL question file, and where it is ("FILE, line N") for error messages."""

    where: str
    number: int
    item: Any


def jsonl_lines(path: Path) -> list[JsonLine]:
    """The non-blank lines of a JSONL question file (`qwenbot eval`, with `--retrieval` too), parsed; an unreadable
    file, a line that is not JSON and a file with no line are each an `EvalFileError` naming where."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise EvalFileError(f"cannot read {path}: {error}") from None
    parsed = [_parsed(f"{path}, line {number}", number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not parsed:
        raise EvalFileError(f"{path} holds no questions")
    return parsed


def _parsed(where: str, number: int, line: str) -> JsonLine:
    try:
        return JsonLine(where, number, json.loads(line))
    except ValueError as error:
        raise EvalFileError(f"{where}: not JSON ({error})") from None


def _case(where: str, number: int, item: Any) -> EvalCase:
    if not isinstance(item, dict) or not isinstance(item.get("q"), str) or not item["q"].strip():
        raise EvalFileError(f'{where}: expected {{"q": "question", "expect": [...]}}')
    unknown = set(item) - set(FIELDS)
    if unknown:
        raise EvalFileError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    if not isinstance(item.get("kind", ""), str):
        raise EvalFileError(f"{where}: kind must be a string")
    lists = {key: item.get(key, []) for key in ("expect", "expect_any", "expect_none")}
    for key, value in lists.items():
        if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
            raise EvalFileError(f"{where}: {key} must be a list of non-empty strings")
    if not lists["expect"] and not lists["expect_any"]:
        raise EvalFileError(f"{where}: give expect or expect_any, or any answer would pass")
    return EvalCase(item["q"], *(tuple(v) for v in lists.values()), line=number, kind=item.get("kind", ""))


def classify(question: str, answer: str, steps: Sequence[dict[str, Any]]) -> str:
    """The class of a turn that ended with an answer that does not hold what was expected (`steps` as a report
    keeps them: kind, action, action_input, observation, error)."""
    errors = {step.get("error") for step in steps}
    if "parse" in errors:
        return "format"
    if is_garbage(question, answer):
        return "garbage"
    if ungrounded(question, answer, steps):
        return "ungrounded"
    if "unknown_tool" in errors:
        return "unknown_tool"
    if "invalid_arguments" in errors:
        return "bad_arguments"
    if not any(step["kind"] in TOOL_KINDS and step.get("error") is None for step in steps):
        return "no_tool_call"
    if is_honest_unknown(answer) or is_apology(answer):
        return "honest_unknown"
    return "wrong_answer"


def is_garbage(question: str, answer: str) -> bool:
    """Whether the answer a user read holds garbage: cleaning it would cut something, or leave no answer."""
    cleaned = clean_answer(answer, question)
    return cleaned.problem is not None or " ".join(cleaned.text.split()) != " ".join(answer.split())


def ungrounded(question: str, answer: str, steps: Sequence[dict[str, Any]]) -> list[str]:
    """The numbers of the answer that neither the question nor any observation of the turn holds."""
    grounds = Grounds(question)
    for step in steps:
        if step["kind"] == StepKind.TOOL and step.get("observation"):
            grounds.observe(step["observation"])
    return grounds.unsupported(answer)


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
        outcome.steps = [{"kind": s.kind, "action": s.action, "action_input": s.action_input,
                          "observation": s.observation, "error": s.error} for s in turn.steps]
        score(outcome)
    outcome.seconds = time.perf_counter() - started
    return outcome


def score(outcome: CaseResult) -> None:
    """Mark a finished question passed, or give its failure a class. An apology is no answer, even when it happens
    to hold an expected word ("could not" for "not "); the honest "could not confirm" is one, where that is right."""
    outcome.passed = not is_apology(outcome.answer) and outcome.case.accepts(outcome.answer)
    outcome.failure = None if outcome.passed else classify(outcome.case.question, outcome.answer, outcome.steps)


async def evaluate(agent: Agent, cases: Sequence[EvalCase]) -> EvalReport:
    """Every case at once, each in its own fresh session."""
    run = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    results = await asyncio.gather(*(run_case(agent, case, f"eval:{run}:{n}") for n, case in enumerate(cases, 1)))
    return EvalReport(list(results), time.perf_counter() - started)


async def rescore(saved: dict[str, Any], cases: Sequence[EvalCase], registry: ToolRegistry) -> EvalReport:
    """A saved report (`--report`) scored again as this version scores: each answer against the question's case
    in `cases` (or, for a question not there, the expectations the report kept). A report written before
    observations were kept gets them back by running its read-only tool calls again on `registry`."""
    by_question = {case.question: case for case in cases}
    results = []
    for entry in saved.get("questions", []):
        case = by_question.get(entry["question"]) or EvalCase(
            entry["question"], *(tuple(entry.get(key, ())) for key in ("expect", "expect_any", "expect_none")))
        outcome = CaseResult(case, entry.get("answer", ""), seconds=entry.get("seconds", 0.0),
                             model_calls=entry.get("model_calls", 0),
                             steps=[await _with_observation(step, registry) for step in entry.get("steps", [])])
        if entry.get("failure") in ("timeout", "error"):
            outcome.failure = entry["failure"]
        else:
            score(outcome)
        results.append(outcome)
    return EvalReport(results, saved.get("wall_seconds", 0.0))


async def _with_observation(step: dict[str, Any], registry: ToolRegistry) -> dict[str, Any]:
    """A saved step with its observation, run again when the report did not keep it (read-only tools only)."""
    if "observation" in step or step["kind"] != StepKind.TOOL or step.get("error"):
        return step
    tool = registry.get(step["action"])
    if tool is None or not tool.read_only:
        return step
    arguments, problem = read_arguments(step["action_input"], tool)
    if problem:
        return step
    return {**step, "observation": (await registry.call(tool.name, arguments)).output}


def compare(report: EvalReport, old: dict[str, Any]) -> list[str]:
    """The questions whose outcome changed since `old` (a saved report): one line each, old → new."""
    before = {entry["question"]: entry for entry in old.get("questions", [])}
    lines = []
    for result in report.results:
        entry = before.get(result.case.question)
        if entry is None:
            lines.append(f"  new    {result.case.question} → {_mark(result.passed, result.failure)}")
            continue
        if (entry.get("passed"), entry.get("failure")) != (result.passed, result.failure):
            lines.append(f"  {_mark(entry.get('passed'), entry.get('failure'))} → "
                         f"{_mark(result.passed, result.failure)}: {result.case.question}  "
                         f"[{_short(entry.get('answer', ''))} → {_short(result.answer)}]")
    gone = [question for question in before if question not in {r.case.question for r in report.results}]
    lines += [f"  gone   {question}" for question in gone]
    old_passed, old_total = old.get("passed", 0), old.get("total", len(before))
    return [f"compared with the old run: {old_passed}/{old_total} then, {report.passed}/{len(report.results)} now; "
            f"{len(lines)} question(s) changed", *lines]


def _mark(passed: bool | None, failure: str | None) -> str:
    return "✓" if passed else f"✗ {failure or 'error'}"


def _short(answer: str, limit: int = 40) -> str:
    flat = " ".join(answer.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


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
              *_kind_lines(report),
              f"replies that broke the format: {report.format_steps()}",
              f"per question: {report.mean('seconds'):.1f} s, {report.mean('model_calls'):.1f} model calls "
              f"(all {total} at once: {report.seconds:.0f} s)"]
    return lines


def _kind_lines(report: EvalReport) -> list[str]:
    """One line per kind of question (when the file marks them), single lookups first."""
    kinds = report.kinds()
    ordered = sorted(kinds, key=lambda kind: kind != SINGLE_LOOKUP)
    return [f"{'single lookups' if kind == SINGLE_LOOKUP else kind}: {int(f['passed'])}/{int(f['total'])} right "
            f"({f['passed'] / f['total']:.0%}), at most {int(f['max_model_calls'])} model calls, "
            f"{f['mean_model_calls']:.1f} on average" for kind in ordered for f in [kinds[kind]]]


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
