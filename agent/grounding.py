"""Grounded numbers: the numbers a turn's final answer may hold, and the ones it holds that nothing supports.

A number in an answer is grounded when the question, the chat's earlier messages, or an observation of this turn
(a calculator result is one) holds it, compared by value: 1.50 is 1.5, 200.0 is 200, "两周" in a question is 2. A
rounded value counts with the decimals it shows (66.67 for 200/3), never as a whole number ("2" is not 1.5). A
date counts when its year, month and day are grounded, however it is written (2024-03-01, 2024年3月1日).

One arithmetic step is accepted too, on a condition. A strong model multiplies 3×2 in its head and writes "3 updates
× 2 hours = 6 hours": a number that is a+b, a−b, a×b or a÷b of two grounded numbers passes when both are visible,
written in the answer or the question, so a reader can check the step. A bare "6" does not: once observations
hold a course list (200, 3, 2, 230, 1.5, 150, 10, …) nearly any small number is one step from two of them (20 is
10×2, the typical wrong answer for 200), so a bare result cannot be told from a guess; it needs the calculator.

Only digits are checked in answers: number words are read from the sources (accepting "两次" when 2 is grounded
is harmless), but an answer's "one of the courses" or "一共" must never count as an ungrounded 1.
"""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal, DivisionByZero, InvalidOperation
from itertools import permutations
from typing import Any, Iterable, Sequence

from agent.numbers import Mention, numbers_in

# The most number literals a grammar is given; past it the grammar leaves numbers free (the check still runs).
MAX_LITERALS = 400
# How much of the observations the corrective reminder lists.
SUMMARY_CHARS = 400


class Grounds:
    """What one turn's answer may draw its numbers from; grows with every observation."""

    def __init__(self, question: str, history: Iterable[str] = ()):
        self.question = question
        self.values: set[Decimal] = set()
        self.written: set[str] = set()
        self.observations: list[str] = []
        self.question_values = _values(numbers_in(question, words=True))
        for text in (question, *history):
            self._take(text)

    def observe(self, observation: str) -> None:
        """An observation of this turn: its numbers are grounded from now on."""
        self.observations.append(observation)
        self._take(observation)

    def unsupported(self, answer: str) -> list[str]:
        """The numbers of `answer`, as written there, that nothing grounds (empty: the answer is grounded)."""
        visible = self.question_values | _values(numbers_in(answer, words=True))
        return [m.written for m in numbers_in(answer) if not self._supports(m, visible)]

    def literals(self) -> tuple[str, ...] | None:
        """Every grounded number as the grammar may let an answer write it (as written in a source, and plainly),
        with the one-step results of the question's own numbers; None when there are too many to list."""
        shown = {_plain(value) for value in self.values} | self.written
        shown |= {_plain(result) for result in _one_step_results(self.question_values) if _short(result)}
        if len(shown) > MAX_LITERALS:
            return None
        return tuple(sorted(shown, key=lambda literal: (-len(literal), literal)))

    def summary(self) -> str:
        """The numbers the observations hold, labelled where the observation says what they are: for the
        corrective reminder."""
        parts = [part for observation in self.observations if (part := _observation_summary(observation))]
        text = "; ".join(parts) or "no numbers"
        return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS - 1] + "…"

    # --- the comparison ---------------------------------------------------------------------------------------

    def _take(self, text: str) -> None:
        for mention in numbers_in(text, words=True):
            self.values.update(mention.parts)  # a number's value, a date's year, month and day
            if mention.kind != "word":
                self.written.update(part for part in _digit_runs(mention.written))

    def _supports(self, mention: Mention, visible: set[Decimal]) -> bool:
        if mention.kind == "date":
            return all(part in self.values for part in mention.parts)
        if self._known(mention.value, mention.decimals):
            return True
        groups = mention.parts[1:]  # 1,000 read as a list: 1 and 000
        if groups and all(group in self.values for group in groups):
            return True
        operands = {value for value in visible if value in self.values}
        return any(_same(result, mention.value, mention.decimals) for result in _one_step_results(operands))

    def _known(self, value: Decimal, decimals: int) -> bool:
        return value in self.values or (decimals > 0 and any(_same(known, value, decimals) for known in self.values))


def _same(exact: Decimal, written: Decimal, decimals: int) -> bool:
    """Whether `written` (with `decimals` digits after the point) is `exact`, or `exact` rounded to them."""
    if exact == written:
        return True
    if decimals <= 0 or -_exponent(exact) <= decimals:
        return False
    return exact.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP) == written


def _one_step_results(operands: set[Decimal]) -> set[Decimal]:
    """a+b, |a−b|, a×b and a÷b for every two of `operands`."""
    results: set[Decimal] = set()
    for a, b in permutations(sorted(operands), 2):
        results.update((a + b, abs(a - b), a * b))
        try:
            results.add(a / b)
        except (DivisionByZero, InvalidOperation):
            pass
    return results


def _values(mentions: Sequence[Mention]) -> set[Decimal]:
    return {part for mention in mentions for part in mention.parts}


def _digit_runs(written: str) -> list[str]:
    """The digit strings a written number is made of, as the grammar compares them ("1,000" → "1", "000")."""
    return [run for run in written.replace(",", " ").replace("-", " ").replace("/", " ").split()
            if run.replace(".", "", 1).isdigit()]


def _plain(value: Decimal) -> str:
    """A value as plainly written: 200, 1.5, 0.25 (no exponent, no trailing zeros)."""
    return format(value.normalize(), "f")


def _short(value: Decimal) -> bool:
    """Whether a computed value is one people write out (at most two decimals, as 66.67 is not)."""
    return -_exponent(value.normalize()) <= 2 and value < 10 ** 12


def _exponent(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return exponent if isinstance(exponent, int) else 0


def _observation_summary(observation: str) -> str:
    """`课程名称 大模型技术实战: 课时 200, 每周更新次数 3` for a JSON record; the numbers as written otherwise."""
    lines = []
    for line in observation.splitlines():
        record = _record(line)
        if record is None:
            numbers = list(dict.fromkeys(m.written for m in numbers_in(line)))
            lines.append(", ".join(numbers))
            continue
        label = next((value for value in record.values() if isinstance(value, str)), "")
        fields = ", ".join(f"{key} {value}" for key, value in record.items()
                           if isinstance(value, (int, float)) and not isinstance(value, bool))
        lines.append(f"{label}: {fields}" if label and fields else fields)
    return "; ".join(line for line in lines if line)


def _record(line: str) -> dict[str, Any] | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
