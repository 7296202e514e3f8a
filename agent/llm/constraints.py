"""Grammar-constrained decoding on the model thread, with llguidance: one matcher per constrained row of a batch.

    GrammarEngine     once per model: llguidance's view of the tokenizer and a thread pool for masks
    RowGrammar        one row's matcher: it takes each token the row generates, and knows if it failed
    GrammarMasks      the logits processor of one `generate`: before every token, the masks of all constrained
                      rows are filled in one call (`fill_next_token_bitmask_par`) and applied; a row without a
                      grammar, or one that has ended, is left exactly as it was

A token the mask allowed is always accepted by the matcher; should it ever not be (a bug, or a forced token such as
the end-of-turn token the benchmark's `min_new_tokens` bans), the row goes on unconstrained and the reason is
logged and kept: its reply is then parsed like any other, and a parse failure is the model's error as usual.
Runs on the model thread only (see `worker.py`).
"""

from __future__ import annotations

import logging
from functools import cached_property
from typing import Any, Sequence

import torch
from transformers import LogitsProcessor

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
        """Fill row `i`'s allowed tokens into `bitmask[i]`, for all rows in one parallel call."""
        from llguidance.torch import fill_next_token_bitmask_par

        fill_next_token_bitmask_par(self._llguidance[1], [(row.matcher, i) for i, row in enumerate(rows)], bitmask)


class GrammarMasks(LogitsProcessor):
    """Masks the next-token scores of every live constrained row of one batch.

    `rows` are the batch's rows in batch order; each has `constraint`, its `RowGrammar` while it is live and
    constrained, else None (batching.py's `BatchRow`).
    """

    def __init__(self, engine: GrammarEngine, rows: Sequence[Any]):
        self.engine = engine
        self.rows = rows

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        live = [(index, row.constraint) for index, row in enumerate(self.rows) if row.constraint is not None]
        if not live:
            return scores
        indices = [index for index, _ in live]
        bitmask = torch.zeros((len(live), (self.engine.vocab_size + 31) // 32), dtype=torch.int32)
        self.engine.fill_masks([grammar for _, grammar in live], bitmask)
        allowed = unpack_bitmask(bitmask, scores.shape[1]).to(scores.device)
        rows = torch.tensor(indices, device=scores.device)
        scores[rows] = scores[rows].masked_fill(~allowed, float("-inf"))
        return scores


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
