"""KV caches of token prefixes kept between batches, so a prompt is computed only past what an earlier one shared.

Runs on the model thread only. Two kinds of prefix come back again and again in this bot: the system prompt with the
tool descriptions (the same ~650-900 tokens for every chat with the same tools), and, within a ReAct turn, the
previous call's prompt plus what the model wrote (the next call adds only the observation). Each finished row stores
the KV of its whole sequence; a new row starts from the longest stored prefix it shares (the KV of a position depends
only on the tokens before it, so any prefix of a stored sequence is itself valid).

The sequences are kept as a tree of runs of tokens (a radix tree, as SGLang's RadixAttention keeps its cache): what
several sequences share is held once, each keeps only the KV past where it parts from the others. A bench's store
held 15 conversations' 15,862 tokens as 3,284 (bench/README.md § "Side by side after the prefix tree");
one conversation growing call by call is one branch. Bounded by bytes, the least recently used branch's end out
first.

A `Hit` is what a prompt reuses: the runs from the first token on and how many of their tokens. Runs are never
changed once made (a run split in two becomes two new runs), so a hit stays valid while the tree changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

import torch

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys and values, each [1, heads, length, head_dim]


@dataclass(eq=False)
class CachedPrefix:
    """One run of tokens and the KV of every one of them (a whole sequence, or a piece of one in the store)."""

    tokens: torch.Tensor  # 1-D, int64, on the CPU
    layers: Layers

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """Memory held by the keys and values."""
        return sum(k.nelement() * k.element_size() + v.nelement() * v.element_size() for k, v in self.layers)

    def common_length(self, tokens: torch.Tensor) -> int:
        """How many leading tokens this run and `tokens` share."""
        return _common_length(self.tokens, tokens)

    def cut(self, start: int, end: int | None = None) -> CachedPrefix:
        """A run of its own (copied, so this one's memory can go) of tokens `start` to `end`."""
        return CachedPrefix(self.tokens[start:end].clone(),
                            [(k[:, :, start:end].clone(), v[:, :, start:end].clone()) for k, v in self.layers])


@dataclass(frozen=True, eq=False)
class Hit:
    """What a prompt may reuse: `runs` one after another from its first token, of which the first `length` tokens
    (0 and no runs: nothing)."""

    runs: tuple[CachedPrefix, ...]
    length: int

    @classmethod
    def whole(cls, prefix: CachedPrefix) -> Hit:
        """All of one run."""
        return cls((prefix,), len(prefix))

    def cut(self, length: int) -> Hit:
        """The same runs, reusing only their first `length` tokens."""
        assert length <= self.length
        return Hit(self.runs, length)

    def then(self, run: CachedPrefix) -> Hit:
        """This hit followed by `run`, which holds the tokens from position `length` on."""
        runs, start = [], 0
        for old in self.runs:
            if start >= self.length:
                break
            used = min(len(old), self.length - start)
            runs.append(old if used == len(old) else old.cut(0, used))
            start += used
        return Hit((*runs, run), self.length + len(run))

    def pieces(self, layer: int, start: int = 0) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        """Layer `layer`'s reusable keys and values from position `start` on, run by run: (first position, keys,
        values), views, in order."""
        found = []
        for first, run in zip(self._starts(), self.runs):
            end = min(first + len(run), self.length)
            if end <= start:
                continue
            if first >= self.length:
                break
            keys, values = run.layers[layer]
            skip = max(start - first, 0)
            found.append((first + skip, keys[:, :, skip: end - first], values[:, :, skip: end - first]))
        return found

    def layers(self, start: int = 0) -> Layers:
        """The reusable keys and values from position `start` on, one tensor a layer (a copy where they lie in
        several runs)."""
        if not self.runs or start >= self.length:
            return []
        return [_joined(self.pieces(index, start)) for index in range(len(self.runs[0].layers))]

    def tokens(self) -> torch.Tensor:
        """The reused tokens."""
        if not self.runs:
            return torch.empty(0, dtype=torch.long)
        return torch.cat([run.tokens for run in self.runs])[: self.length]

    def same_columns(self, other: Hit, limit: int) -> int:
        """How many of the first `limit` positions hold the very same tokens and KV in both hits: the runs they share
        count without a look; past those, the tokens and then the KV are compared."""
        same = 0
        for mine, theirs in zip(self.runs, other.runs):
            if mine is not theirs:
                break
            same += len(mine)
        if same >= limit:
            return limit
        end = same + _common_length(self.tokens()[same:limit], other.tokens()[same:limit])
        mine_kv, their_kv = self.cut(end).layers(), other.cut(end).layers()
        for (keys, values), (their_keys, their_values) in zip(mine_kv, their_kv):
            if not (torch.equal(keys[:, :, same:], their_keys[:, :, same:])
                    and torch.equal(values[:, :, same:], their_values[:, :, same:])):
                return same
        return end

    def _starts(self) -> list[int]:
        return [0, *accumulate(len(run) for run in self.runs)][:-1]


MISS = Hit((), 0)


def _common_length(one: torch.Tensor, other: torch.Tensor) -> int:
    """How many leading tokens two 1-D token tensors share."""
    width = min(len(one), len(other))
    differ = torch.nonzero(one[:width] != other[:width])
    return int(differ[0]) if len(differ) else width


def _holds_more(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is a view of a larger storage."""
    return tensor.untyped_storage().nbytes() > tensor.nelement() * tensor.element_size()


def _joined(pieces: list[tuple[int, torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    if len(pieces) == 1:
        return pieces[0][1], pieces[0][2]
    return torch.cat([keys for _, keys, _ in pieces], dim=2), torch.cat([values for _, _, values in pieces], dim=2)


@dataclass(eq=False)
class _Node:
    """A place in the tree: the run its branch adds, the branches that go on from it (by their first token), and
    when a sequence through it was last stored or reused."""

    run: CachedPrefix
    parent: _Node | None = None
    children: dict[int, _Node] = field(default_factory=dict)
    used: int = 0


class PrefixStore:
    """The stored sequences, at most `budget_bytes` of KV; a budget of 0 keeps nothing."""

    def __init__(self, budget_bytes: int):
        self.budget_bytes = budget_bytes
        self._root = _Node(CachedPrefix(torch.empty(0, dtype=torch.long), []))
        self._nbytes = 0
        self._clock = 0
        self.reused_tokens = 0  # totals since start, for the benchmark and the log
        self.computed_tokens = 0

    @property
    def nbytes(self) -> int:
        """Memory held by every run."""
        return self._nbytes

    def __len__(self) -> int:
        """How many sequences it holds (ends of branches)."""
        return sum(1 for node in self._nodes() if not node.children)

    def longest(self, prompt: list[int]) -> Hit:
        """The longest stored prefix of `prompt`, leaving at least its last token to compute (its logits are
        what the next token is chosen from)."""
        if len(prompt) < 2 or not self._root.children:
            return MISS
        path, matched = self._walk(torch.tensor(prompt, dtype=torch.long))
        length = min(matched, len(prompt) - 1)
        if not length:
            return MISS
        self._touch(path[-1][0])
        runs, start = [], 0
        for node, _ in path:
            if start >= length:
                break
            runs.append(node.run)
            start += len(node.run)
        return Hit(tuple(runs), length)

    def known_length(self, tokens: list[int]) -> int:
        """How many leading tokens of `tokens` the store holds the KV of already."""
        return self._walk(torch.tensor(tokens, dtype=torch.long))[1] if self._root.children and tokens else 0

    def put(self, tokens: list[int], layers: Layers, start: int = 0) -> None:
        """Store the KV of `tokens`, whose `layers` hold positions `start` on (the store knowing the ones before:
        `known_length`); only what the store does not hold yet takes memory, and what the budget cannot keep goes,
        least recently used first."""
        if not self.budget_bytes or not tokens:
            return
        wanted = torch.tensor(tokens, dtype=torch.long)
        path, matched = self._walk(wanted)
        if matched < start:  # the store no longer holds what the caller left out
            return
        if matched == len(tokens):  # held already, within or at the end of a branch
            self._touch(path[-1][0])
            return
        new = CachedPrefix(wanted[matched:], [(k[:, :, matched - start:], v[:, :, matched - start:])
                                              for k, v in layers])
        if new.nbytes > self.budget_bytes:
            return
        if any(_holds_more(keys) or _holds_more(values) for keys, values in new.layers):
            new = new.cut(0)  # a view would keep the rest of the caller's tensor alive, uncounted
        node = self._add(self._split(*path[-1]) if path else self._root, new)
        self._touch(node)
        self._evict()

    def count(self, reused: int, computed: int) -> None:
        """Add one row's prompt tokens to the totals."""
        self.reused_tokens += reused
        self.computed_tokens += computed

    def _walk(self, tokens: torch.Tensor) -> tuple[list[tuple[_Node, int]], int]:
        """The nodes whose runs `tokens` follows from the root, each with how many of its run's tokens it shares
        (all but maybe the last node's), and how many tokens that makes."""
        path, node, position = [], self._root, 0
        while position < len(tokens):
            child = node.children.get(int(tokens[position]))
            if child is None:
                break
            shared = child.run.common_length(tokens[position:])
            path.append((child, shared))
            position += shared
            if shared < len(child.run):
                break
            node = child
        return path, position

    def _split(self, node: _Node, keep: int) -> _Node:
        """`node` cut after its first `keep` tokens, the rest a branch of its own below it; the node holding the
        first part (itself when it is kept whole). New runs for both parts: a hit may hold the old one."""
        if keep == len(node.run):
            return node
        rest = _Node(node.run.cut(keep), parent=node, children=node.children, used=node.used)
        for child in rest.children.values():
            child.parent = rest
        node.run, node.children = node.run.cut(0, keep), {int(rest.run.tokens[0]): rest}
        return node

    def _add(self, parent: _Node, run: CachedPrefix) -> _Node:
        node = _Node(run, parent=parent)
        parent.children[int(run.tokens[0])] = node
        self._nbytes += run.nbytes
        return node

    def _touch(self, node: _Node) -> None:
        self._clock += 1
        while node is not None:
            node.used = self._clock
            node = node.parent

    def _evict(self) -> None:
        """Drop the least recently used branch ends until the store is within its budget."""
        while self._nbytes > self.budget_bytes:
            oldest = min((node for node in self._nodes() if not node.children), key=lambda node: node.used)
            assert oldest.parent is not None
            del oldest.parent.children[int(oldest.run.tokens[0])]
            self._nbytes -= oldest.run.nbytes

    def _nodes(self) -> list[_Node]:
        found, waiting = [], list(self._root.children.values())
        while waiting:
            node = waiting.pop()
            found.append(node)
            waiting.extend(node.children.values())
        return found
