"""One batch of requests, greedy: prefix reuse, layout, per-row grammars and ends, pauses; the decode loop itself
is decode_loop.py.

Runs on the model thread only (see `model_thread.py`). The choices here (their measurements: bench/README.md § Engine
design measurements):

- A padded batch through our own decode loop, not transformers' continuous-batching manager (`generate_batch`):
  the manager was less than half as fast on a CPU (its paged attention has no fast CPU path), and has no
  per-request stop strings or cancellation. The loop is
  ours rather than `generate` so that a step can check speculative tokens per row (speculative.py).
- No prompt token is computed twice while its KV is known. ReAct prompts are long (the system message and every
  tool description: ~690 tokens) and on a CPU prefill is compute-bound. Each row starts from the longest prefix the
  `PrefixStore` holds of it (the tools' prompt, or its own turn so far); the prefix every row of a batch shares is
  computed once when the store knows less of it. Rows are laid out `[reused prefix][padding][own tokens]`; the
  attention mask hides the padding and positions are counted per row, so each row's tokens continue at the right
  position.
- Continuous batching, the simple way: when a newcomer waits and the batch has room, the batch pauses after the
  current step, its unfinished rows keep their KV (on the row itself, not in the store: a paused row is live work,
  and an LRU store under a full batch would evict it and make the next batch recompute whole prompts), and the
  next batch takes them with the newcomer. A row's caller is answered the moment the row ends, not when the batch
  does.
- The batch's cache is written in place and grows a block of columns at a time (kv_cache.py): transformers' own
  cache copies every row's whole KV at every step, which was a third of the model thread's time in the eval.
- The prefix the rows share holds the same KV in every row (checked: `shared_columns`), so a decode step's attention
  reads it once for the batch (attention.py), not once a row.
- A row may be decoded under a grammar (agent/grammar.py): before each token the decode loop masks each
  constrained row by its own matcher (grammar_masks.py), and the row feeds its matcher the token it took. The
  matcher belongs to the row, so a paused row resumes where its grammar left it; it sees generated tokens only, so
  a reused prompt prefix cannot change what it allows. Rows without a grammar are left exactly as they were.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache

from agent.llm.base import MAX_NEW_TOKENS, Message
from agent.llm.engine.attention import reads_shared_prefix
from agent.llm.engine.decode_loop import Decoding, cache_argument, decode
from agent.llm.engine.grammar_masks import GrammarEngine, RowGrammar
from agent.llm.engine.kv_cache import KV_DTYPE, batch_cache, cache_holding, shared_columns
from agent.llm.engine.prefix_store import CachedPrefix, Hit, PrefixStore
from agent.llm.engine.speculative import PromptLookup, SpeculativeLength, SpeculativeLimits
from agent.llm.engine.text_stream import TextStream

log = logging.getLogger(__name__)

# Below this many shared tokens, computing the prefix separately is not worth a second forward pass.
MIN_SHARED_PREFIX = 32
# What one forward pass of its own costs a row prefilled apart, counted in prompt tokens: a pass reads every weight
# once, as a decode step does, which costs about what 16-20 tokens of prefill do on a CPU (bench/README.md).
APART_PASS_TOKENS = 16
# Columns of the batch's cache a row's new token may take with speculative tokens on: the token and the holes its
# rejected guesses leave. Every later step's attention reads the holes, so they are bounded; guesses stop there.
SPECULATIVE_ROOM = 2


@dataclass
class BatchRow:
    """One request across the batches it takes part in: its prompt and limits in; its new tokens and end out.

    A row may be paused between two batches (a newcomer joins at the next step: see `generate_rows`); it then
    resumes in a later batch from its stored KV, with `new_ids` holding what it generated so far.

    Per-row state that changes as tokens come lives here, not in the batch, so it survives a pause: the row's
    grammar matcher, the text streamed to its caller, its prompt lookup. The decode loop hands it each token it takes
    (`add`, then `take`).
    """

    prompt_ids: list[int]
    stop: Sequence[str] = ()
    max_new_tokens: int = MAX_NEW_TOKENS
    is_cancelled: Callable[[], bool] = lambda: False
    owner: Any = None  # whoever asked (the model thread keeps the caller's job here)
    stream: TextStream | None = None  # where the row's new text goes as it is generated, if its caller listens
    grammar: RowGrammar | None = None  # the grammar this row is decoded under, if its caller gave one
    reason: str = ""  # "stop", "length" or "cancelled"; empty while it is still generating (or paused)
    new_ids: list[int] = field(default_factory=list)
    paused_kv: Hit | None = None  # while paused: the KV of its context up to its last token, which it resumes from
    reused_tokens: int = 0  # prompt tokens taken from the prefix cache rather than computed
    _lookup: PromptLookup | None = None  # built at its first guess, then kept up to date, across pauses too
    speculative_length: SpeculativeLength = field(default_factory=SpeculativeLength)  # as its guesses fare

    @property
    def context_ids(self) -> list[int]:
        """Everything the next step continues: the prompt and what was generated so far."""
        return self.prompt_ids + self.new_ids

    @property
    def finished(self) -> bool:
        """Whether the row has ended (stop string, end of turn, token limit or cancellation)."""
        return self.reason != ""

    @property
    def constraint(self) -> RowGrammar | None:
        """The grammar that masks this row's next token: while the row runs and its grammar holds."""
        if self.finished or self.grammar is None or not self.grammar.active:
            return None
        return self.grammar

    def take(self, token_id: int) -> None:
        """The row generated `token_id`: its grammar moves on, and its text goes to its caller."""
        if self.grammar is not None:
            self.grammar.advance(token_id)
        if self.stream is not None:
            self.stream.push(token_id)

    def add(self, token_id: int, tokenizer: Any, eos_ids: set[int]) -> None:
        """The model chose `token_id` next: the row takes it, then ends if its caller cancelled, on an end-of-turn
        token (which is not text), on a stop string, or at its token limit."""
        if self.is_cancelled():
            self.reason = "cancelled"
            return
        if token_id in eos_ids:
            self.reason = "stop"
            return
        self.new_ids.append(token_id)
        if self._lookup is not None:
            self._lookup.extend([token_id])
        self.take(token_id)
        if self.stop and _has_stop(tokenizer.decode(self.new_ids), self.stop):
            self.reason = "stop"
        elif len(self.new_ids) >= self.max_new_tokens:
            self.reason = "length"

    def speculate(self, limit: int) -> list[int]:
        """Up to `limit` tokens that may come next (fewer while its guesses fare badly: `speculative_length`):
        looked up in the row's own context (speculative.py), or for a constrained row what its grammar forces or
        accepts of that."""
        if limit <= 0:
            return []
        limit = self.speculative_length.clamp(limit)
        if self._lookup is None:
            self._lookup = PromptLookup(self.context_ids)
        guess = self._lookup.propose(limit)
        return guess if self.constraint is None else self.constraint.allowed_ahead(guess)[:limit]


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


def _has_stop(text: str, stop: Sequence[str]) -> bool:
    return any(s and s in text for s in stop)


@dataclass(frozen=True)
class BatchLayout:
    """The batch as tensors, each row `[reused prefix][padding][own tokens]`, and the mask hiding the padding.

    The reused prefixes (their KV comes from the prefix cache) fill the first `cached` columns; every row's last
    token is in the last column. The decode loop counts positions from the mask, so each row's own tokens continue at
    the right position whatever its padding.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    cached: int  # columns whose KV is given (the longest reused prefix); 0: a plain left-padded batch
    reused: tuple[int, ...]  # per row, how many of its tokens are reused

    def own_columns(self, row: int, length: int) -> torch.Tensor:
        """Columns holding the row's tokens: its reused prefix, then its own tokens (`length` in all)."""
        width = self.input_ids.shape[1]
        reused = self.reused[row]
        return torch.cat([torch.arange(reused), torch.arange(width - (length - reused), width)])


def lay_out(contexts: list[list[int]], reused: Sequence[int], pad_id: int, device: Any) -> BatchLayout:
    """Place each row's reused prefix first and its own tokens last, padding between."""
    cached = max(reused, default=0)
    own = [context[n:] for context, n in zip(contexts, reused)]
    width = cached + max(map(len, own))
    ids, mask = [], []
    for context, n, tail in zip(contexts, reused, own):
        gap = width - n - len(tail)
        ids.append(context[:n] + [pad_id] * gap + tail)
        mask.append([1] * n + [0] * gap + [1] * len(tail))
    return BatchLayout(torch.tensor(ids, device=device), torch.tensor(mask, device=device), cached, tuple(reused))


def shared_prefix_length(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with, leaving each at least one token of its own; 0 if not worth sharing."""
    if len(prompts) < 2:
        return 0
    limit = min(map(len, prompts)) - 1
    length = 0
    while length < limit and all(prompt[length] == prompts[0][length] for prompt in prompts):
        length += 1
    return length if length >= MIN_SHARED_PREFIX else 0


def generate_rows(model: Any, tokenizer: Any, rows: list[BatchRow], min_new_tokens: int = 0,
                  store: PrefixStore | None = None, should_pause: Callable[[], bool] = lambda: False,
                  on_finished: Callable[[BatchRow], None] = lambda row: None,
                  grammars: GrammarEngine | None = None,
                  speculative: SpeculativeLimits = SpeculativeLimits(),
                  on_pass: Callable[[int, int], None] = lambda offered, taken: None) -> None:
    """Greedy generation for all `rows` at once, each starting from the longest prefix `store` holds of it.

    Fills each row's `new_ids` and, once it ends, its `reason`, and tells `on_finished` at once (its caller need
    not wait for the batch's longest row). When `should_pause` turns true while rows are still generating (a
    newcomer waits), the batch stops after the current step: rows left unfinished keep their KV (`paused_kv`) and
    resume from it in the next batch, beside the newcomer. Rows with a grammar are masked by it (`grammars`
    compiled them); each step may check a few speculative tokens per row (`speculative`, decode_loop.py).
    `on_pass` hears of every pass through the model (decode_loop.py's `Decoding.on_pass`).
    """
    store = store if store is not None else PrefixStore(0)
    eos = eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    longest = max(row.max_new_tokens - len(row.new_ids) for row in rows)
    with torch.inference_mode():
        hits, fresh = reusable_prefixes(model, [row.context_ids for row in rows], store,
                                        held=[row.paused_kv for row in rows])
        prefill_apart(model, rows, hits, fresh, store)
        layout = lay_out([row.context_ids for row in rows], [hit.length for hit in hits], pad_id, model.device)
        # The columns every row's whole generation may take, holes that rejected guesses leave included: guesses
        # are kept within it (decode_loop.py); the cache grows towards it as steps need (kv_cache.py).
        room = layout.input_ids.shape[1] + longest * (SPECULATIVE_ROOM if speculative.per_row else 1)
        cache = batch_cache(model, hits, layout.cached, layout.input_ids.shape[1], room - layout.input_ids.shape[1])
        _begin(rows, hits, fresh, store)
        # Columns every row holds the same KV for, read once a step; only looked for where the attention would.
        kv_dtype = getattr(model, KV_DTYPE, None) or model.dtype
        shared = shared_columns(hits) if reads_shared_prefix(model, kv_dtype) else 0
        log.debug("batch of %d: reused %s prompt tokens, %d columns the same in every row, computed %d columns",
                  len(rows), layout.reused, shared, layout.input_ids.shape[1] - layout.cached)
        # Without a store (PREFIX_CACHE_MB=0) a batch runs to its end: the plain mode.
        run = Decoding(model, tokenizer, eos, pad_id, min_new_tokens, grammars, speculative,
                       should_pause if store.budget_bytes else (lambda: False), on_finished, on_pass)
        mask = decode(run, rows, layout.input_ids, layout.attention_mask, layout.cached, cache, room, shared)
        _store_rows(rows, mask, cache, store)


def reusable_prefixes(model: Any, contexts: list[list[int]], store: PrefixStore,
                      held: Sequence[Hit | None] = ()) -> tuple[list[Hit], list[int]]:
    """For each row, the longest prefix whose KV is known (`held` by the row itself when it was paused, else
    found in the store); the prefix every row of the batch shares is computed once here (from what the store
    knows of it) when that reaches further, so no row computes it again.

    Also returns, per row, how many tokens of its prefix were computed here rather than found in the store: the
    shared prefix's new tokens count once, for the first row that takes it; the other rows did reuse them.
    """
    held = list(held) + [None] * (len(contexts) - len(held))
    hits = [own or store.longest(context) for context, own in zip(contexts, held)]
    fresh = [0] * len(contexts)
    shared = shared_prefix_length(contexts)
    if shared and min(hit.length for hit in hits) < shared:
        base = max(hits, key=lambda hit: hit.length)
        if base.length >= shared:
            common = base.cut(shared)
        else:
            common = extend_prefix(model, contexts[0][:shared], base)
            _keep(store, contexts[0][:shared], common)
            fresh[next(i for i, hit in enumerate(hits) if hit.length < shared)] = shared - base.length
        hits = [hit if hit.length >= shared else common for hit in hits]
    return hits, fresh


def rows_to_prefill_apart(own: Sequence[int]) -> set[int]:
    """Which rows to prefill on their own, given how many tokens each has past its reused prefix (`own`, the last
    one included), so that the batch computes the fewest columns.

    A padded batch computes its longest row's own part for every row: 8 rows whose observations run from 80 to
    300 tokens cost 8 × 300. A row prefilled apart costs its own tokens but one, plus a pass of its own
    (`APART_PASS_TOKENS`), and then one column in the batch. Taking rows apart longest first, the cheapest cut
    is found in one sweep; rows of equal length stay together (a resumed row, needing one column, always does).
    """
    order = sorted(range(len(own)), key=lambda index: own[index], reverse=True)
    best_cost, best_cut = len(own) * max(own, default=1), 0
    apart_cost = 0
    for cut, index in enumerate(order, start=1):
        apart_cost += own[index] - 1 + APART_PASS_TOKENS
        width = max((own[rest] for rest in order[cut:]), default=1)
        if apart_cost + len(own) * width < best_cost:
            best_cost, best_cut = apart_cost + len(own) * width, cut
    return set(order[:best_cut])


def prefill_apart(model: Any, rows: list[BatchRow], hits: list[Hit], fresh: list[int], store: PrefixStore) -> None:
    """Compute the prompts of the rows `rows_to_prefill_apart` picks, each on its own up to its last token.

    A newcomer joining resumed rows is the common case: its question and history (often 100-300 tokens past the
    cached tools prompt) would otherwise be computed for each resumed row too, which needs one token; so is a
    batch of second calls whose observations differ in length. Apart, each row's tokens are computed once.
    """
    own = [len(row.context_ids) - hit.length for row, hit in zip(rows, hits)]
    for index in sorted(rows_to_prefill_apart(own)):
        context, hit = rows[index].context_ids, hits[index]
        hits[index] = extend_prefix(model, context[:-1], hit)
        _keep(store, context[:-1], hits[index])
        fresh[index] += len(context) - 1 - hit.length


def extend_prefix(model: Any, tokens: list[int], base: Hit) -> Hit:
    """The KV of `tokens`, computing only those past the prefix `base` already holds: `base`'s runs and a new one
    (only the new columns are copied out of the pass's cache)."""
    known = base.length
    cache = cache_holding(model, base.layers()) if known else DynamicCache(config=model.config)
    model(input_ids=torch.tensor([tokens[known:]], device=model.device), use_cache=True, logits_to_keep=1,
          **{cache_argument(model): cache})
    dtype = getattr(model, KV_DTYPE, None)  # held as the batch caches hold it, so the store keeps one dtype

    def new_columns(states: torch.Tensor) -> torch.Tensor:
        return states[:, :, known:].to(dtype or states.dtype, copy=bool(known))

    layers = [(new_columns(layer.keys), new_columns(layer.values)) for layer in cache.layers]
    return base.then(CachedPrefix(torch.tensor(tokens[known:], dtype=torch.long), layers))


def _keep(store: PrefixStore, tokens: list[int], hit: Hit) -> None:
    """Put `hit` (the KV of `tokens`) in the store, handing over only the columns it does not hold yet (the new run's
    tensors themselves when the store held the rest: no copy)."""
    known = store.known_length(tokens)
    store.put(tokens, hit.layers(known), known)


def _begin(rows: list[BatchRow], hits: list[Hit], fresh: list[int], store: PrefixStore) -> None:
    for row, hit, computed_here in zip(rows, hits, fresh):
        if not row.new_ids:  # a row's first batch: count what its prompt reused
            row.reused_tokens = hit.length - computed_here
            store.count(row.reused_tokens, len(row.prompt_ids) - row.reused_tokens)
        row.paused_kv = None  # the batch's cache holds it now


def _store_rows(rows: list[BatchRow], mask: torch.Tensor, cache: DynamicCache, store: PrefixStore) -> None:
    """Keep each row's KV, its whole sequence so far: a finished row's in the store, for its chat's next call (only
    the columns past what the store holds are copied out); a paused row's on the row, for its next batch (whatever
    the store's budget). A row's tokens are the columns its mask shows, in order (padding and a guess's rejected
    positions are not)."""
    for index, row in enumerate(rows):
        if row.finished and not store.budget_bytes:
            continue
        columns = mask[index].nonzero().squeeze(1)
        tokens = row.context_ids[: len(columns)]  # the newest token was never fed back: its KV is not there
        known = store.known_length(tokens) if row.finished else 0
        if known == len(tokens):
            store.put(tokens, [], known)  # held already: marks it recently used
            continue
        columns = columns[known:]
        layers = [(layer.keys[index:index + 1].index_select(2, columns.to(layer.keys.device)),
                   layer.values[index:index + 1].index_select(2, columns.to(layer.values.device)))
                  for layer in cache.layers]
        if row.finished:
            store.put(tokens, layers, known)
        else:
            row.paused_kv = Hit.whole(CachedPrefix(torch.tensor(tokens, dtype=torch.long), layers))


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every end-of-turn token id: the generation config's (Qwen lists two) and the tokenizer's."""
    configured = model.generation_config.eos_token_id
    ids = set(configured if isinstance(configured, list) else [configured] if configured is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
