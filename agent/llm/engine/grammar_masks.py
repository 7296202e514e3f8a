"""Grammar-constrained decoding on the model thread, with llguidance: one matcher per constrained row of a batch.

    GrammarEngine     once per model: llguidance's view of the tokenizer and a thread pool for masks
    RowGrammar        one row's matcher: it takes each token the row generates, and knows if it failed

The decode loop (decode_loop.py) fills the masks of all constrained rows of a batch in one call before each token
(`GrammarEngine.fill_masks`, llguidance's executor) and applies them; a row without a grammar,
or one that has ended, is left exactly as it was.

A token the mask allowed is always accepted by the matcher; should it ever not be (a bug, or a forced token such as
the end-of-turn token the benchmark's `min_new_tokens` bans), the row goes on unconstrained and the reason is
logged and kept: its reply is then parsed like any other, and a parse failure is the model's error as usual.
Runs on the model thread only (see `model_thread.py`).
"""

from __future__ import annotations

import logging
from functools import cached_property
from typing import Any, Sequence

import torch

from agent.errors import LLMError
from agent.grammar import Grammar

log = logging.getLogger(__name__)

_BITS = torch.arange(32, dtype=torch.int32)


class RowGrammar:
    """One row's grammar state: an llguidance matcher fed with every token the row generates."""

    def __init__(self, matcher: Any, kind: str):
        self.matcher = matcher
        self.kind = kind
        self.failure = ""  # why the row stopped being constrained; empty while it is

    @property
    def active(self) -> bool:
        """Whether the grammar still masks this row."""
        return not self.failure

    def allowed_ahead(self, guess: list[int]) -> list[int]:
        """What the row may check ahead: the tokens the grammar forces next (an action's `Action Input: `, a
        JSON key), else the part of `guess` (speculative.py) the grammar would accept; `guess` once it has failed."""
        if self.failure:
            return guess
        forced = self.matcher.compute_ff_tokens()
        if forced:
            return forced
        return guess[: self.matcher.validate_tokens(guess)] if guess else []

    def advance(self, token_id: int) -> None:
        """Feed the row's newest token; a rejected one ends the constraint (logged), never the row."""
        if self.failure:
            return
        if not self.matcher.consume_token(token_id):
            self.failure = self.matcher.get_error().splitlines()[0] or "token rejected"
            log.warning("a %s grammar rejected token %d; the row goes on unconstrained: %s",
                        self.kind, token_id, self.failure)


class GrammarEngine:
    """llguidance for one tokenizer: compiles a grammar into a row's matcher, and fills many rows' masks at once."""

    def __init__(self, tokenizer: Any):
        self._tokenizer = tokenizer

    @cached_property
    def _llguidance(self) -> tuple[Any, Any]:
        # Built on first use (about a second for a 50k vocabulary): a bot with constraints off never pays for it.
        import llguidance
        import llguidance.hf

        return llguidance.hf.from_tokenizer(self._tokenizer), llguidance.LLExecutor()

    @property
    def vocab_size(self) -> int:
        """Tokens llguidance knows; model logits beyond this (padding rows of the embedding) are never allowed."""
        return self._llguidance[0].vocab_size

    def row(self, grammar: Grammar) -> RowGrammar:
        """A fresh matcher for `grammar`; a grammar llguidance refuses is our bug, raised as `LLMError`."""
        from llguidance import LLMatcher

        try:
            tokenizer = self._llguidance[0]
        except Exception as error:  # e.g. a slow (Python) tokenizer, which llguidance cannot read
            raise LLMError(f"constrained decoding is not available for this tokenizer: {error}; "
                           "set CONSTRAINED_DECODING=false") from error
        matcher = LLMatcher(tokenizer, grammar.lark)
        if matcher.is_error():
            raise LLMError(f"the {grammar.kind} grammar does not compile: {matcher.get_error().splitlines()[0]}")
        return RowGrammar(matcher, grammar.kind)

    def fill_masks(self, rows: Sequence[RowGrammar], bitmask: torch.Tensor) -> None:
        """Fill row `i`'s allowed tokens into `bitmask[i]` (int32, contiguous, on the CPU), for all rows in one
        parallel call. What llguidance.torch's `fill_next_token_bitmask_par` calls, called directly: importing that
        module `torch.compile`s a kernel at import, which imports torch's compiler (a second of the first answer)."""
        words = bitmask.shape[1]
        self._llguidance[1].unsafe_compute_mask_ptr([(row.matcher, i) for i, row in enumerate(rows)],
                                                    bitmask.data_ptr(), words * 4, bitmask.shape[0])

    def mask(self, scores: torch.Tensor, constrained: Sequence[tuple[int, RowGrammar]]) -> None:
        """Set to -inf, in place, every token of `scores` ([rows, vocabulary]) that each `(row, grammar)` pair's
        grammar does not allow next; other rows are left exactly as they were."""
        if not constrained:
            return
        bitmask = torch.zeros((len(constrained), (self.vocab_size + 31) // 32), dtype=torch.int32)
        self.fill_masks([grammar for _, grammar in constrained], bitmask)
        allowed = unpack_bitmask(bitmask, scores.shape[1]).to(scores.device)
        which = torch.tensor([row for row, _ in constrained], device=scores.device)
        scores[which] = scores[which].masked_fill(~allowed, float("-inf"))


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """llguidance's packed masks (32 tokens per int32, lowest bit first) as booleans, `vocab` wide.

    Plain tensor operations: llguidance's own `apply_token_bitmask_inplace` is `torch.compile`d, which on a CPU
    means a C++ toolchain and a compile at first use.
    """
    bits = ((bitmask.unsqueeze(-1) >> _BITS) & 1).bool().reshape(bitmask.shape[0], -1)
    if bits.shape[1] >= vocab:
        return bits[:, :vocab]
    padding = torch.zeros((bits.shape[0], vocab - bits.shape[1]), dtype=torch.bool)
    return torch.cat([bits, padding], dim=1)
