"""What a final answer passes before a user reads it: garbage cut (agent/garbage.py), its numbers grounded
(agent/grounding.py, when GROUNDED_ANSWERS is on).

    accept    the answer, cleaned (notes, echoes and loops cut)
    remind    turned back once a turn: the model is told what was wrong (for numbers: what the observations hold)
    replace   the second failure: the honest "I could not confirm that" in the question's language; the step's
              error says why (`ungrounded: 20 …`, `garbage: …`)

One reminder per turn, whatever it was for, so a turn spends at most one extra model call here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agent.apologies import apology, language_of
from agent.garbage import clean_answer
from agent.grounding import Grounds
from agent.prompts import GARBAGE_REMINDER, UNGROUNDED_REMINDER


class Verdict(StrEnum):
    """What becomes of a final answer."""

    ACCEPT = "accept"
    REMIND = "remind"
    REPLACE = "replace"


@dataclass(frozen=True)
class Review:
    """A verdict on one answer: the text a user may read (accept, replace), what the model is told (remind), and
    why it was not accepted (the step's error)."""

    verdict: Verdict
    answer: str = ""
    reminder: str = ""
    error: str | None = None


class AnswerReview:
    """The safety nets of one turn: `review` each final answer; the first failure reminds, the next replaces."""

    def __init__(self, question: str, grounds: Grounds | None):
        self.question = question
        self.grounds = grounds  # None: numbers are not checked (GROUNDED_ANSWERS=false)
        self.reminded = False

    def review(self, answer: str, *, may_remind: bool = True) -> Review:
        """The verdict on `answer`; `may_remind` False when no model call is left to take a reminder."""
        cleaned = clean_answer(answer, self.question)
        missing = self.grounds.unsupported(cleaned.text) if self.grounds and not cleaned.problem else []
        if cleaned.problem is None and not missing:
            return Review(Verdict.ACCEPT, cleaned.text)
        error = cleaned.problem or f"ungrounded: {', '.join(missing)} (in no observation, nor the question)"
        if may_remind and not self.reminded:
            self.reminded = True
            return Review(Verdict.REMIND, cleaned.text, self._reminder(cleaned.problem, missing), error)
        return Review(Verdict.REPLACE, apology("unconfirmed", language_of(self.question)), error=error)

    def _reminder(self, problem: str | None, missing: list[str]) -> str:
        if problem is not None:
            return GARBAGE_REMINDER.format(problem=problem.removeprefix("garbage: "))
        assert self.grounds is not None
        return UNGROUNDED_REMINDER.format(numbers=", ".join(missing), summary=self.grounds.summary())
