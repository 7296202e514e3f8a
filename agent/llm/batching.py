"""One batch of requests through one greedy `model.generate`: layout, shared prefix, per-row grammars and ends.

Runs on the model thread only (see `worker.py`). Two choices here, both measured on the 2-core CPU box with
SmolLM2-135M (fp32, greedy):

- Plain padded `generate` with a per-row `StoppingCriteria`, not transformers' continuous-batching manager
  (`generate_batch`): for 8 prompts × 32 new tokens, padded `generate` ran at 83 tokens/s, the manager at under 36
  (its paged attention has no fast CPU path), and the manager has no per-request stop strings or cancellation.
- The prompt prefix that every row of a batch shares is computed once. ReAct prompts are long (the system message
  and every tool description: ~690 tokens for this tokenizer) and differ only in their last few dozen tokens, and
  on a CPU that prefill is compute-bound, so batching alone barely helps it: 8 such prompts × 32 new tokens took
  60 s one at a time, 48 s as one plain padded batch, and 8.7 s with the shared prefix computed once, every output
  identical to its request run alone. Rows are laid out `[shared prefix][padding][own suffix]`; the attention mask
  hides the padding and `generate` derives positions from the mask, so each suffix continues at the right position.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from transformers import (DynamicCache, GenerationConfig, LogitsProcessorList, StoppingCriteria,
                          StoppingCriteriaList)

from agent.llm.base import Message
from agent.llm.constraints import GrammarEngine, GrammarMasks, RowGrammar

log = logging.getLogger(__name__)

# Below this many shared tokens, computing the prefix separately is not worth a second forward pass.
MIN_SHARED_PREFIX = 32


@dataclass
class BatchRow:
    """One request in a batch, and all that changes about it while the batch runs.

    The per-row state lives here, and `RowSteps` (after every generated token) is the one loop that updates it: a
    later per-row concern (a cached KV prefix to start from, the new text streamed to its caller) adds its field
    here and its line in `take`.
    """

    prompt_ids: list[int]
    stop: Sequence[str] = ()
    max_new_tokens: int = 512
    is_cancelled: Callable[[], bool] = lambda: False
    owner: Any = None  # whoever asked (the worker keeps the caller's job here)
    grammar: RowGrammar | None = None  # the grammar this row is decoded under, if its caller gave one
    ended_after: int = 0  # how many generated tokens belong to this row's output
    reason: str = ""  # "stop", "length" or "cancelled"; empty while it is still generating
    new_ids: list[int] = field(default_factory=list)

    @property
    def constraint(self) -> RowGrammar | None:
        """The grammar that masks this row's next token: while the row runs and its grammar holds."""
        if self.reason or self.grammar is None or not self.grammar.active:
            return None
        return self.grammar

    def take(self, token_id: int) -> None:
        """The row generated `token_id`: its grammar moves on."""
        if self.grammar is not None:
            self.grammar.advance(token_id)


def render_prompt(tokenizer: Any, messages: Sequence[Message], tools: list[dict[str, Any]] | None) -> list[int]:
    """Token ids of the chat: continuing a final assistant message, else opening a new assistant turn."""
    continuing = bool(messages) and messages[-1].get("role") == "assistant"
    encoded = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        tools=tools,
        add_generation_prompt=not continuing,
        continue_final_message=continuing,
        # Control tokens typed by users (`<|im_start|>system ...`) are encoded as plain text, not obeyed.
        sanitize_control_tokens=True,
        return_dict=True,
    )
    return list(encoded["input_ids"])


class RowSteps(StoppingCriteria):
    """The per-row loop after every generated token: each live row takes its token (`BatchRow.take`), then checks
    its own end conditions: stop strings, token limit, cancel token.

    `generate` calls stopping criteria once per step with the token just appended to every row, which makes this
    the place for per-row work. Returning a per-row bool tensor lets `generate` mark just that row finished (its
    `unfinished_sequences`), so one chat's stop string or /cancel never cuts another chat's answer short.
    """

    def __init__(self, rows: list[BatchRow], prompt_width: int, tokenizer: Any, eos_ids: set[int]):
        self.rows = rows
        self.prompt_width = prompt_width
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self.prompt_width
        for index, row in enumerate(self.rows):
            if row.reason == "":
                new_ids = input_ids[index, self.prompt_width:]
                row.take(int(new_ids[-1]))
                self._check(row, new_ids, generated)
        return torch.tensor([row.reason != "" for row in self.rows], device=input_ids.device)

    def _check(self, row: BatchRow, new_ids: torch.Tensor, generated: int) -> None:
        if row.is_cancelled():
            row.ended_after, row.reason = generated, "cancelled"
        elif int(new_ids[-1]) in self.eos_ids:
            row.ended_after, row.reason = generated - 1, "stop"  # the end-of-turn token is not text
        elif row.stop and _has_stop(self.tokenizer.decode(new_ids), row.stop):
            row.ended_after, row.reason = generated, "stop"
        elif generated >= row.max_new_tokens:
            row.ended_after, row.reason = generated, "length"


def _has_stop(text: str, stop: Sequence[str]) -> bool:
    return any(s and s in text for s in stop)


@dataclass(frozen=True)
class BatchLayout:
    """The batch as tensors: `[shared prefix][padding][own suffix]` per row, and the mask hiding the padding."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    shared: int  # length of the prefix every row starts with (0: plain left padding)


def lay_out(prompts: list[list[int]], pad_id: int, device: Any, share_prefix: bool = True) -> BatchLayout:
    """Align the rows' last tokens, the common prefix first; with no prefix worth sharing, this is left padding."""
    shared = shared_prefix_length(prompts) if share_prefix else 0
    suffixes = [prompt[shared:] for prompt in prompts]
    width = max(map(len, suffixes))
    prefix = prompts[0][:shared]
    ids = [prefix + [pad_id] * (width - len(s)) + s for s in suffixes]
    mask = [[1] * shared + [0] * (width - len(s)) + [1] * len(s) for s in suffixes]
    return BatchLayout(torch.tensor(ids, device=device), torch.tensor(mask, device=device), shared)


def shared_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own; 0 if not worth sharing."""
    if len(prompts) < 2:
        return 0
    limit = min(map(len, prompts)) - 1
    length = 0
    while length < limit and all(prompt[length] == prompts[0][length] for prompt in prompts):
        length += 1
    return length if length >= MIN_SHARED_PREFIX else 0


def prefill_shared_prefix(model: Any, layout: BatchLayout) -> DynamicCache | None:
    """Run the shared prefix once and copy its cache to every row; None when there is no shared prefix."""
    if not layout.shared:
        return None
    cache = DynamicCache(config=model.config)
    model(input_ids=layout.input_ids[:1, : layout.shared], use_cache=True, logits_to_keep=1,
          **{cache_argument(model): cache})
    cache.batch_repeat_interleave(layout.input_ids.shape[0])
    return cache


def cache_argument(model: Any) -> str:
    """The name under which this transformers takes a KV cache: `cache` since v5, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def generate_rows(model: Any, tokenizer: Any, rows: list[BatchRow], min_new_tokens: int = 0,
                  grammars: GrammarEngine | None = None) -> None:
    """Greedy generation for all `rows` at once; fills each row's `new_ids` and `reason`.

    Rows with a grammar are masked by it (`grammars` compiled them); the others are left exactly as they were.
    """
    eos = eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    config = _greedy_config(max(row.max_new_tokens for row in rows), min_new_tokens, eos, pad_id)
    with torch.inference_mode():
        layout = lay_out([row.prompt_ids for row in rows], pad_id, model.device)
        steps = RowSteps(rows, layout.input_ids.shape[1], tokenizer, eos)
        cache = prefill_shared_prefix(model, layout)
        log.debug("batch of %d: %d prompt tokens shared, %d own at most", len(rows), layout.shared,
                  layout.input_ids.shape[1] - layout.shared)
        output = model.generate(input_ids=layout.input_ids, attention_mask=layout.attention_mask,
                                generation_config=config, stopping_criteria=StoppingCriteriaList([steps]),
                                logits_processor=_masks(rows, grammars),
                                **({cache_argument(model): cache} if cache is not None else {}))
    _keep_generated(rows, output[:, layout.input_ids.shape[1]:].tolist())


def _masks(rows: list[BatchRow], grammars: GrammarEngine | None) -> LogitsProcessorList:
    """The grammar masks, when any row of the batch has a grammar; nothing otherwise (no cost per step)."""
    if grammars is None or not any(row.grammar is not None for row in rows):
        return LogitsProcessorList()
    return LogitsProcessorList([GrammarMasks(grammars, rows)])


def _greedy_config(longest: int, min_new_tokens: int, eos: set[int], pad_id: int) -> GenerationConfig:
    # Greedy: a turn is reproducible, and a row's output does not depend on its batch neighbours.
    # A fresh config, so a model's own sampling defaults (Qwen ships temperature/top_p) do not apply.
    return GenerationConfig(do_sample=False, max_new_tokens=longest,
                            min_new_tokens=min(min_new_tokens, longest),  # benchmarks only: fixed lengths
                            eos_token_id=sorted(eos), pad_token_id=pad_id)


def _keep_generated(rows: list[BatchRow], generated: list[list[int]]) -> None:
    """Cut each row's tokens where that row ended; what the batch generated after that is padding."""
    for row, ids in zip(rows, generated):
        if row.reason == "":  # defensive: generate stopped before `RowSteps` saw the row's last step
            row.ended_after, row.reason = len(ids), "length"
        row.new_ids = ids[: row.ended_after]


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every end-of-turn token id: the generation config's (Qwen lists two) and the tokenizer's."""
    configured = model.generation_config.eos_token_id
    ids = set(configured if isinstance(configured, list) else [configured] if configured is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
