"""The decode loop of one batch: greedy steps over the batch's KV cache, each row checking a few speculative tokens.

Runs on the model thread only (see `model_thread.py`), called by `generate_rows` (batch.py) once the batch is laid
out and its cache holds the reused prefixes. Each step is one pass through the model (forward_pass.py, or the
model's own forward). Our own loop rather than `model.generate`, because a step here may feed each row more than
one token: its next token and the speculative tokens that may follow it (speculative.py). One pass computes them
all; each row then takes the model's greedy choice position by position, for as long as the guess agrees, so the
text is what one token a step would give. A guess's rejected positions stay in the cache as masked holes: the rows
of a batch share their columns, so a row that took fewer tokens cannot close up; positions are counted per row.

The per-row work after every pass, position by position (`Verifier`):

- the grammar of a constrained row masks its scores at each position (its matcher moves on with each token taken);
- the benchmark's `min_new_tokens` bans the end-of-turn tokens until a row has that many;
- each token taken goes to the row (`BatchRow.take`: grammar, streamed text), then the row's ends are checked:
  cancel token, end of turn, stop strings, token limit. A row that ends is handed to `on_finished` at once.

Between passes the batch pauses when a newcomer waits (`should_pause`): its rows then resume in the next batch.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from agent.llm.engine import forward_pass
from agent.llm.engine.attention import shared_prefix
from agent.llm.engine.grammar_masks import GrammarEngine
from agent.llm.engine.speculative import SpeculativeLimits

log = logging.getLogger(__name__)


@dataclass
class Decoding:
    """What the loop needs besides the rows: the model and how a row ends."""

    model: Any
    tokenizer: Any
    eos_ids: set[int]
    pad_id: int
    min_new_tokens: int = 0
    grammars: GrammarEngine | None = None
    speculative: SpeculativeLimits = SpeculativeLimits()
    should_pause: Callable[[], bool] = lambda: False
    on_finished: Callable[[Any], None] = lambda row: None
    # After every pass through the model: the speculative tokens it checked, and how many of them were taken (the
    # model thread counts them, and knows from it that the batch is making progress).
    on_pass: Callable[[int, int], None] = lambda offered, taken: None


def decode(run: Decoding, rows: Sequence[Any], input_ids: torch.Tensor, mask: torch.Tensor, cached: int,
           cache: Any, room: int, shared: int = 0) -> torch.Tensor:
    """Generate for `rows` (batch.py's `BatchRow`) until every one has ended or the batch pauses; returns the
    final attention mask, whose ones are the columns of the cache holding each row's tokens.

    `input_ids`/`mask` are the laid-out batch (`[reused prefix][padding][own tokens]`); the cache holds its first
    `cached` columns and has `room` columns in all; its first `shared` columns are the same in every row."""
    mask = mask.clone()
    same = shared_prefix(run.model, shared)
    first = _forward(run.model, input_ids[:, cached:], mask, _prompt_positions(mask)[:, cached:], cache, keep=1,
                     **same)
    Verifier(run, rows).take(first, [[] for _ in rows])
    run.on_pass(0, 0)
    positions = mask.sum(dim=1)  # each row's newest token comes right after its prompt
    passes, offered, agreed = 1, 0, 0
    while any(not row.finished for row in rows) and not run.should_pause():
        guesses = _speculate(run, rows, room - mask.shape[1])
        width = 1 + max(map(len, guesses))
        ids, fed = _step_inputs(rows, guesses, width, run.pad_id, mask.device)
        mask = torch.cat([mask, fed], dim=1)
        logits = _forward(run.model, ids, mask, positions[:, None] + torch.arange(width, device=mask.device), cache,
                          keep=width, **same)
        taken = Verifier(run, rows).take(logits, guesses)
        for index, count in enumerate(taken):  # a guess's rejected positions become holes
            mask[index, mask.shape[1] - width + count:] = 0
            rows[index].speculative_length.judge(len(guesses[index]), count - 1, run.speculative.per_row)
        positions += torch.tensor(taken, device=mask.device)
        step_offered, step_agreed = sum(map(len, guesses)), sum(max(0, count - 1) for count in taken)
        run.on_pass(step_offered, step_agreed)
        passes, offered, agreed = passes + 1, offered + step_offered, agreed + step_agreed
    log.debug("decoded %d rows in %d passes: %d speculative tokens checked, %d taken", len(rows), passes, offered,
              agreed)
    return mask


def cache_argument(model: Any) -> str:
    """The name under which this transformers takes a KV cache: `cache` since v5, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _prompt_positions(mask: torch.Tensor) -> torch.Tensor:
    """Each column's position in its row: how many of the row's tokens come before it (0 on padding)."""
    return (mask.cumsum(dim=1) - 1).clamp(min=0)


def _forward(model: Any, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any,
             keep: int, **attention: Any) -> torch.Tensor:
    """One pass over `ids` (appended to the cache): the scores of its last `keep` columns, as float32.
    `attention`: keywords for the attention function (attention.py's `shared_prefix`). A decode step of a model
    whose forward forward_pass.py mirrors runs there, with the same scores and fewer calls."""
    if forward_pass.fits(model, cache, ids.shape[1]):
        return forward_pass.decode_pass(model, ids, mask, positions, cache, keep, **attention)
    output = model(input_ids=ids, attention_mask=mask, position_ids=positions, **{cache_argument(model): cache},
                   use_cache=True, logits_to_keep=keep, **attention)
    return output.logits.float()


def _speculate(run: Decoding, rows: Sequence[Any], free_columns: int) -> list[list[int]]:
    """Each live row's speculative tokens: as many as the limits allow, and never so many that the cache's room
    could run out before the longest row's token limit (a step uses 1 + the longest guess columns, and takes at
    least 1)."""
    live = [row for row in rows if not row.finished]
    needed = max(row.max_new_tokens - len(row.new_ids) for row in live)
    limit = min(run.speculative.for_rows(len(live)), max(0, free_columns - needed))
    return [row.speculate(min(limit, row.max_new_tokens - len(row.new_ids) - 1)) if not row.finished else []
            for row in rows]


def _step_inputs(rows: Sequence[Any], guesses: list[list[int]], width: int, pad_id: int,
                 device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's tokens, `[newest token][guess][padding]` per row, and their mask (ended rows feed nothing)."""
    ids, fed = [], []
    for row, guess in zip(rows, guesses):
        tokens = [] if row.finished else [row.new_ids[-1], *guess]  # a live row has taken a token by now
        ids.append(tokens + [pad_id] * (width - len(tokens)))
        fed.append([1] * len(tokens) + [0] * (width - len(tokens)))
    return torch.tensor(ids, device=device), torch.tensor(fed, device=device, dtype=torch.long)


class Verifier:
    """One pass's choices: each live row takes the greedy token at each position, while its guess agrees."""

    def __init__(self, run: Decoding, rows: Sequence[Any]):
        self.run = run
        self.rows = rows

    def take(self, logits: torch.Tensor, guesses: Sequence[Sequence[int]]) -> list[int]:
        """Let every live row take its tokens from `logits` ([rows, positions, vocabulary]); returns, per row, how
        many of the fed columns hold its tokens (its newest token, and the speculative tokens it agreed with)."""
        taken = [0] * len(self.rows)
        going = [index for index, row in enumerate(self.rows) if not row.finished]
        plain = logits.argmax(dim=-1).tolist()  # every position's choice where nothing masks it: one call
        for position in range(logits.shape[1]):
            if not going:
                break
            choices = self._choose(logits[:, position], going, [best[position] for best in plain])
            going = [index for index in going if self._accept(index, choices[index], guesses[index], position,
                                                              taken)]
        return taken

    def _choose(self, scores: torch.Tensor, going: list[int], plain: list[int]) -> dict[int, int]:
        """The greedy token of each going row at one position, after its grammar and the end-token ban; rows
        with neither take their `plain` choice."""
        masked = [index for index in going if self.rows[index].constraint is not None
                  or len(self.rows[index].new_ids) < self.run.min_new_tokens]
        if not masked:
            return {index: plain[index] for index in going}
        scores = scores.clone()
        self._ban_early_ends(scores, going)
        self._apply_grammars(scores, going)
        best = scores.argmax(dim=-1).tolist()
        return {index: best[index] if index in masked else plain[index] for index in going}

    def _ban_early_ends(self, scores: torch.Tensor, going: list[int]) -> None:
        early = [index for index in going if len(self.rows[index].new_ids) < self.run.min_new_tokens]
        if early:
            rows = torch.tensor(early, device=scores.device)[:, None]
            scores[rows, torch.tensor(sorted(self.run.eos_ids), device=scores.device)[None, :]] = float("-inf")

    def _apply_grammars(self, scores: torch.Tensor, going: list[int]) -> None:
        if self.run.grammars is not None:
            self.run.grammars.mask(scores, [(index, self.rows[index].constraint) for index in going
                                            if self.rows[index].constraint is not None])

    def _accept(self, index: int, token: int, guess: Sequence[int], position: int, taken: list[int]) -> bool:
        """Row `index` takes `token` at `position`; whether it goes on to the next position."""
        row = self.rows[index]
        taken[index] = position + 1  # the column fed at this position holds one of its tokens
        row.add(token, self.run.tokenizer, self.run.eos_ids)
        if row.finished:
            self.run.on_finished(row)
            return False
        return position < len(guess) and guess[position] == token
