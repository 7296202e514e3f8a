"""Speculative tokens from a row's own context (prompt lookup): what came after the last time its newest tokens
appeared.

An agent's replies copy a lot from their prompt: tool names, argument values, the numbers of an observation, the
format's own words. When the last few tokens of a row occurred earlier in its prompt or output, the tokens that
followed them then are a good guess for what follows now. The decode loop (decode_loop.py) feeds such a guess beside
the row's next token and checks it in the same forward pass: on a CPU a pass reads every weight once whether it
computes one token or six, so every guessed token the model agrees with is a token for free. The check takes the
model's own greedy choice at every position, so the output is the one plain decoding gives.

On the benchmark's ReAct prompts about two tokens a pass are taken (bench/README.md § Engine design measurements).
Settings: SPECULATIVE_TOKENS (`SpeculativeLimits.per_row`) and SPECULATIVE_STEP_TOKENS (`per_step`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class SpeculativeLimits:
    """How many speculative tokens a step may check: per row, and for the whole batch.

    On a CPU a pass over one row costs about the same for 1 token as for 6 (the weights are read once either
    way), but a batch of 8 rows already computes 8 tokens a pass, and more cost nearly in proportion: so the rows
    share `per_step` tokens (their next tokens included) and a full batch checks none at all.
    """

    per_row: int = 5
    per_step: int = 8

    def for_rows(self, live: int) -> int:
        """The speculative tokens each of `live` rows may check in one pass."""
        return max(0, min(self.per_row, self.per_step // max(live, 1) - 1))


class SpeculativeLength:
    """How many speculative tokens one row may offer next, moved by how its guesses fare: two more after a guess the
    model took whole, one fewer (down to 1) after one it cut short (the schedule transformers' assisted generation calls
    "heuristic").

    A rejected guess costs its columns in the pass that checked it, and stays in the batch's cache as a masked hole
    that every later step's attention reads (batch.py's SPECULATIVE_ROOM bounds them). A fixed length fills the
    room their holes may take within a few long guesses, then passes one token at a time; this schedule takes
    fewer passes and less time (bench/README.md).
    """

    def __init__(self) -> None:
        self.value: int | None = None  # None until the row's first guess: then as long as allowed

    def clamp(self, limit: int) -> int:
        """The length the row's next guess may have, where the step allows `limit`."""
        if self.value is None:
            self.value = limit
        return min(limit, self.value)

    def judge(self, offered: int, agreed: int, most: int) -> None:
        """The model agreed with `agreed` of the `offered` speculative tokens; `most` is the longest a guess may be."""
        if offered and self.value is not None:
            self.value = min(most, self.value + 2) if agreed >= offered else max(1, self.value - 1)


# The longest run of newest tokens looked up; longer runs are tried first (a longer match is a better guess).
NGRAM_MAX = 3


class PromptLookup:
    """Where each run of 1..NGRAM_MAX tokens of one row's context last ended, kept up to date as tokens come."""

    def __init__(self, tokens: Sequence[int]):
        self.tokens: list[int] = []
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> the index of its last token, latest occurrence
        self._previous: dict[int, int] = {}  # n -> where the newest n-gram occurred before its newest occurrence
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """The row's context grew by `tokens`."""
        for token in tokens:
            self.tokens.append(token)
            end = len(self.tokens) - 1
            for n in range(1, NGRAM_MAX + 1):
                if n > len(self.tokens):
                    break
                key = tuple(self.tokens[-n:])
                earlier = self._ends.get(key)
                if earlier is None:
                    self._previous.pop(n, None)
                else:
                    self._previous[n] = earlier
                self._ends[key] = end

    def propose(self, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the longest earlier occurrence of the context's newest tokens."""
        if limit <= 0:
            return []
        for n in range(NGRAM_MAX, 0, -1):
            earlier = self._previous.get(n)
            if earlier is not None:
                return self.tokens[earlier + 1: earlier + 1 + limit]
        return []
