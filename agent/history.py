"""What the model sees of a session's past: its running summary, its newest turns, and the last turn's observations.

    [system]     Summary of the earlier conversation …      (when older turns were folded: agent/summaries.py)
    [user]       an earlier question                        } the newest whole turns that fit
    [assistant]  its answer                                 } HISTORY_TOKEN_BUDGET, less the summary
    [user]       the last question
    [assistant]  its answer, then a note of what its tools returned (cut to LAST_OBSERVATIONS_TOKENS)

The summary is a system message of its own, after the main one: the main system message stays the same for
every chat (its tokens are cached across chats), and no invented exchange stands for it. The last turn keeps what
its tools returned, so a follow-up ("and the other course?", "how many hours a week is that?") is answered from it
without a second lookup. It is a note after the answer, not a replayed ReAct trace: the history is data to the
model (agent/untrusted.py quotes any line of it that reads as a step), and a tool's result must never read as one.
"""

from __future__ import annotations

from typing import Callable, Sequence

from agent.llm.base import Message
from agent.memory import HistoryView
from agent.steps import Step

SUMMARY_HEADER = "Summary of the earlier conversation (its older turns, folded by the assistant):"
LOOKED_UP_HEADER = "(What I looked up for this answer:"
CUT_NOTE = "… [cut]"


def history_messages(view: HistoryView, last_steps: Sequence[Step], count_tokens: Callable[[str], int],
                     observation_tokens: int) -> list[Message]:
    """The history part of a prompt: the summary, the window, the last turn with its observations."""
    messages: list[Message] = []
    if view.summary is not None:
        messages.append({"role": "system", "content": f"{SUMMARY_HEADER}\n{view.summary.text}"})
    window = [dict(message) for message in view.messages]
    if last_steps and observation_tokens > 0 and window and window[-1]["role"] == "assistant":
        looked_up = cut_observations(last_steps, count_tokens, observation_tokens)
        window[-1]["content"] = with_observations(window[-1]["content"], looked_up)
    return messages + window


def with_observations(answer: str, steps: Sequence[Step]) -> str:
    """The last answer, then a note of the tool calls behind it and what they returned."""
    notes = [f"- {step.action} {step.action_input.strip()}: {step.observation}" for step in steps]
    return "\n".join([answer, "", LOOKED_UP_HEADER, *notes]) + ")"


def cut_observations(steps: Sequence[Step], count_tokens: Callable[[str], int], budget: int) -> list[Step]:
    """The steps with their observations cut so that together they hold at most `budget` tokens; the first
    come first, and steps past the budget are left out."""
    kept: list[Step] = []
    for step in steps:
        if budget <= 0:
            break
        observation = cut_to_tokens(step.observation, count_tokens, budget)
        budget -= count_tokens(observation)
        kept.append(Step(step.position, step.kind, step.thought, step.action, step.action_input, observation,
                         step.error, step.duration_ms))
    return kept


def cut_to_tokens(text: str, count_tokens: Callable[[str], int], limit: int) -> str:
    """`text` if it holds at most `limit` tokens, else its longest start that does with a note saying it was cut."""
    if count_tokens(text) <= limit:
        return text
    low, high = 0, len(text)  # the longest prefix whose text and note fit: a binary search over characters
    while low < high:
        middle = (low + high + 1) // 2
        if count_tokens(text[:middle] + CUT_NOTE) <= limit:
            low = middle
        else:
            high = middle - 1
    return text[:low] + CUT_NOTE
