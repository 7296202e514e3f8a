"""Memory that summarises: a long history's oldest turns are folded into a running summary, written by the model.

After each stored turn the agent calls `Summarizer.after_turn`. When the session's turns since its summary no longer
fit HISTORY_TOKEN_BUDGET (with the summary), a background task folds the oldest of them, until what is left holds at
most SUMMARY_KEEP_TOKENS (the newest turn always stays whole), into a new summary: the model is asked at LOW
priority (`Priority.LOW`: on the local engine it runs only while no person's call waits or runs, and steps aside
at the next step when one comes; on a server it goes through its own narrow lane), so a summary never delays
anyone's turn. Until it is written the window simply holds the newest
turns that fit, as it would without summaries.

The summary is written in the chat's language (the language most of the folded questions are in), stored per
session (agent/memory.py), and placed at the head of the history (agent/history.py). It is stored only if the
session is still as it was when the summary was asked for: a /reset meanwhile, or another summary, wins.
One summary at a time per session; a failure is logged and tried again after the next turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

from agent.apologies import language_of
from agent.errors import LLMError
from agent.llm.base import LLM, ModelRequest, Priority
from agent.memory import Memory, PastTurn, Summary
from agent.native import strip_thinking

log = logging.getLogger(__name__)

LANGUAGE_NAMES = {"zh": "Chinese (简体中文)", "en": "English"}
SUMMARY_INSTRUCTIONS = (
    "You keep the running summary of a conversation between a user and an assistant, so that the assistant "
    "remembers it later. Keep facts, numbers, names, what was looked up, decisions and open questions; drop "
    "greetings and small talk. Write plain sentences, no headings, no lists of turns."
)
SUMMARY_REQUEST = ("Summary so far:\n{previous}\n\nNewer turns to fold into it:\n\n{turns}\n\n"
                   "Write the updated summary, in {language}, in at most {words} words. Reply with the summary only.")


@dataclass(frozen=True)
class SummaryLimits:
    """When and how long summaries are; `Settings` (the memory group) takes its defaults from here."""

    enabled: bool = True  # SUMMARY_ENABLED
    max_tokens: int = 300  # SUMMARY_MAX_TOKENS: the summary's own length, the model call's token limit
    keep_tokens: int = 1000  # SUMMARY_KEEP_TOKENS: the newest turns left whole after a fold


class Summarizer:
    """Folds sessions' oldest turns into their running summaries, in the background."""

    def __init__(self, llm: LLM, memory: Memory, history_budget: int, limits: SummaryLimits = SummaryLimits()):
        self.llm = llm
        self.memory = memory
        self.history_budget = history_budget
        self.limits = limits
        self.written = 0  # summaries stored since start (the bench reads it)
        self._running: dict[str, asyncio.Task] = {}

    def after_turn(self, session_id: str, user_key: str) -> None:
        """A turn of `session_id` was stored: fold its oldest turns in the background if the history is too long
        (nothing happens while a fold of that session runs already)."""
        if not self.limits.enabled or session_id in self._running:
            return
        task = asyncio.create_task(self._fold_quietly(session_id, user_key), name=f"summary of {session_id}")
        self._running[session_id] = task
        task.add_done_callback(lambda _: self._running.pop(session_id, None))

    async def idle(self) -> None:
        """Wait until no summary is being written."""
        while self._running:
            await asyncio.gather(*list(self._running.values()), return_exceptions=True)

    async def close(self) -> None:
        """Stop the summaries being written (they are tried again after the session's next turn)."""
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def fold(self, session_id: str, user_key: str = "") -> Summary | None:
        """Fold the session's oldest turns into its summary now, if its history is past the budget; the summary
        stored, or None (nothing to fold, nothing written, or the session changed meanwhile)."""
        previous = await self.memory.summary(session_id)
        turns = await self.memory.turns_after(session_id, previous.through_turn_id if previous else 0)
        folded = self.turns_to_fold(turns, previous)
        if not folded:
            return None
        language = chat_language(folded)
        text = await self._write(previous, folded, language, user_key)
        if not text:
            log.warning("the summary of %s came back empty; the turns stay unfolded", session_id)
            return None
        summary = Summary(text, folded[-1].turn_id, (previous.folded_turns if previous else 0) + len(folded), language)
        if not await self.memory.save_summary(session_id, summary, previous):
            log.info("the summary of %s was not stored: the session changed while it was written", session_id)
            return None
        self.written += 1
        return summary

    def turns_to_fold(self, turns: Sequence[PastTurn], previous: Summary | None) -> list[PastTurn]:
        """The oldest turns to fold: none while the turns and the summary fit the budget; else the oldest until
        what is left holds at most `keep_tokens`, the newest turn always left whole."""
        costs = [turn.cost(self.llm.count_tokens) for turn in turns]
        summary_cost = self.llm.count_tokens(previous.text) if previous else 0
        if sum(costs) + summary_cost <= self.history_budget:
            return []
        left, folded = sum(costs), []
        for turn, cost in zip(turns[:-1], costs):
            if left <= self.limits.keep_tokens:
                break
            folded.append(turn)
            left -= cost
        return folded

    async def _fold_quietly(self, session_id: str, user_key: str) -> None:
        try:
            await self.fold(session_id, user_key)
        except LLMError as error:
            log.warning("the summary of %s was not written: %s", session_id, error)
        except Exception:
            if self.memory.db.closed:  # shutting down under it
                return
            log.exception("the summary of %s failed", session_id)

    async def _write(self, previous: Summary | None, folded: Sequence[PastTurn], language: str,
                     user_key: str) -> str:
        request = ModelRequest(summary_prompt(previous, folded, language, self.limits.max_tokens),
                               max_new_tokens=self.limits.max_tokens, user_key=user_key, priority=Priority.LOW)
        completion = await self.llm.complete(request)
        text, _ = strip_thinking(completion.text)
        return text.strip()


def summary_prompt(previous: Summary | None, folded: Sequence[PastTurn], language: str,
                   max_tokens: int) -> list[dict[str, str]]:
    """The messages asking the model for the updated summary."""
    turns = "\n\n".join(f"{_speaker(m['role'])}: {m['content']}" for turn in folded for m in turn.messages)
    request = SUMMARY_REQUEST.format(previous=previous.text if previous else "(none yet)", turns=turns,
                                     language=LANGUAGE_NAMES.get(language, "English"), words=max_tokens * 2 // 3)
    return [{"role": "system", "content": SUMMARY_INSTRUCTIONS}, {"role": "user", "content": request}]


def chat_language(turns: Sequence[PastTurn]) -> str:
    """'zh' or 'en': the language most of the turns' questions are in (a tie goes to the newest question's)."""
    questions = [m["content"] for turn in turns for m in turn.messages if m["role"] == "user"]
    if not questions:
        return "en"
    votes = Counter(language_of(question) for question in questions)
    if votes["zh"] == votes["en"]:
        return language_of(questions[-1])
    return votes.most_common(1)[0][0]


def _speaker(role: str) -> str:
    return "User" if role == "user" else "Assistant"
