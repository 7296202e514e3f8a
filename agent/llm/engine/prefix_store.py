"""KV caches of token prefixes kept between batches, so a prompt is computed only past what an earlier one shared.

Runs on the model thread only. Two kinds of prefix come back again and again in this bot: the system prompt with the
tool descriptions (the same ~650 tokens for every chat with the same tools), and, within a ReAct turn, the previous
call's prompt plus what the model wrote (the next call adds only the observation). Each finished row stores the KV of
its whole sequence; a new row starts from the longest stored sequence it shares a prefix with, cut to that prefix
(the KV of a position depends only on the tokens before it, so any prefix of a stored sequence is itself valid).

The store is bounded by bytes, least recently used out. A stored sequence that is a prefix of a newer one is
dropped, being contained in it: one conversation holds one entry, however many calls it made.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys and values, each [1, heads, length, head_dim]


@dataclass
class CachedPrefix:
    """One stored sequence: its tokens and the KV of every one of them."""

    tokens: torch.Tensor  # 1-D, int64, on the CPU
    layers: Layers

    @property
    def nbytes(self) -> int:
        """Memory held by the keys and values."""
        return sum(k.nelement() * k.element_size() + v.nelement() * v.element_size() for k, v in self.layers)

    def common_length(self, prompt: torch.Tensor) -> int:
        """How many leading tokens this sequence and `prompt` share."""
        width = min(len(self.tokens), len(prompt))
        differ = torch.nonzero(self.tokens[:width] != prompt[:width])
        return int(differ[0]) if len(differ) else width


@dataclass(frozen=True)
class Hit:
    """What a prompt may reuse: the entry and how many of its leading tokens (0: nothing)."""

    entry: CachedPrefix | None
    length: int

    def layers(self) -> Layers:
        """The reusable keys and values, cut to the shared prefix."""
        assert self.entry is not None
        return [(k[:, :, : self.length], v[:, :, : self.length]) for k, v in self.entry.layers]


MISS = Hit(None, 0)


class PrefixStore:
    """The stored sequences, at most `budget_bytes` of KV; a budget of 0 keeps nothing."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[int, CachedPrefix] = OrderedDict()  # oldest use first
        self._next_key = 0
        self.reused_tokens = 0  # totals since start, for the benchmark and the log
        self.computed_tokens = 0

    @property
    def nbytes(self) -> int:
        """Memory held by every entry."""
        return sum(entry.nbytes for entry in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, prompt: list[int]) -> Hit:
        """The longest stored prefix of `prompt`, leaving at least its last token to compute (its logits are
        what the next token is chosen from)."""
        if not self._entries or len(prompt) < 2:
            return MISS
        wanted = torch.tensor(prompt, dtype=torch.long)
        best, best_length = None, 0
        for key, entry in self._entries.items():
            length = min(entry.common_length(wanted), len(prompt) - 1)
            if length > best_length:
                best, best_length = key, length
        if best is None:
            return MISS
        self._entries.move_to_end(best)
        return Hit(self._entries[best], best_length)

    def put(self, tokens: list[int], layers: Layers) -> None:
        """Store the KV of `tokens` (one per token), dropping what it contains and what the budget cannot keep."""
        if not self.budget_bytes or not tokens:
            return
        entry = CachedPrefix(torch.tensor(tokens, dtype=torch.long), layers)
        if entry.nbytes > self.budget_bytes:
            return
        for key in [k for k, old in self._entries.items() if _is_prefix(old.tokens, entry.tokens)]:
            del self._entries[key]
        self._entries[self._next_key] = entry
        self._next_key += 1
        while self.nbytes > self.budget_bytes:
            self._entries.popitem(last=False)

    def count(self, reused: int, computed: int) -> None:
        """Add one row's prompt tokens to the totals."""
        self.reused_tokens += reused
        self.computed_tokens += computed


def _is_prefix(shorter: torch.Tensor, longer: torch.Tensor) -> bool:
    return len(shorter) <= len(longer) and bool(torch.equal(shorter, longer[: len(shorter)]))
