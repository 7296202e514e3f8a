"""The KV cache of one batch: every step written into it in place, in tensors that grow a block of columns at a
time.

transformers' `DynamicLayer` concatenates each step's keys and values onto the whole cache, so a step copies every
row's full KV (and allocates it anew). With the long ReAct prompts of this bot that copy is what a batch spends its
time on (hundreds of MB a step: bench/README.md § Engine design measurements), and the same again when a paused
batch is rebuilt. Here a layer grows by `GROWTH_COLUMNS` when a
step needs more room, one copy every dozens of steps. Not the whole generation's room at once: the CPU decode
attention reads the whole tensor, filled or not, when its spare columns are few (attention.py), and most replies
end long before their token limit.

Runs on the model thread only (see `model_thread.py`).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agent.llm.engine.internals import CacheLayer, on_checked_path
from agent.llm.engine.prefix_store import Hit, Layers


# Columns a layer's tensors grow by: a copy of the batch's KV every 128 columns (a dozen or more steps, speculative
# tokens included), and at most 128 spare columns for the decode attention to read (a tenth of a ReAct prompt's).
GROWTH_COLUMNS = 128
# A model attribute naming the dtype its batch caches hold KV in, where not its own (weights.py: int8 on bf16 CPUs).
KV_DTYPE = "qwenbot_kv_dtype"
# Below this many columns the same in every row, the decode attention reads each row's own (`shared_columns`):
# reading a short prefix once saves less than the split attention's extra products cost.
MIN_SHARED_COLUMNS = 128


class RoomyLayer(CacheLayer):
    """One layer's KV for a batch, in tensors with room for `room` columns, grown when a step needs more;
    `keys`/`values` are views of the columns filled so far, as `DynamicLayer` would hold them."""

    def __init__(self, room: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.room = room
        self.kv_dtype = dtype  # None: the model's own
        self.length = 0  # columns filled

    def open_like(self, key_states: torch.Tensor) -> None:
        self.open(key_states.shape[0], key_states.shape[1], key_states.shape[3], key_states)

    def open(self, batch: int, heads: int, head_dim: int, like: torch.Tensor) -> None:
        """Allocate the room: zeros, so that masked padding columns hold nothing that could turn into NaN."""
        self.device = like.device
        shape = (batch, heads, self.room, head_dim)
        dtype = self.kv_dtype or like.dtype
        self._keys, self._values = like.new_zeros(shape, dtype=dtype), like.new_zeros(shape, dtype=dtype)
        self.is_initialized = True
        self.filled(0)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.open_like(key_states)
        end = self.length + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            self._grow(end)
        self._keys[:, :, self.length:end] = key_states
        self._values[:, :, self.length:end] = value_states
        self.filled(end)
        return self.keys, self.values

    def fill(self, row: int, keys: torch.Tensor, values: torch.Tensor, start: int = 0) -> None:
        """Put a piece of one row's cached prefix (`[1, heads, length, head_dim]`) in its columns from `start`."""
        self._keys[row, :, start: start + keys.shape[2]] = keys[0]
        self._values[row, :, start: start + values.shape[2]] = values[0]

    def _grow(self, end: int) -> None:
        extra = (*self._keys.shape[:2], end - self._keys.shape[-2] + GROWTH_COLUMNS, self._keys.shape[-1])
        self._keys = torch.cat([self._keys, self._keys.new_zeros(extra)], dim=-2)
        self._values = torch.cat([self._values, self._values.new_zeros(extra)], dim=-2)

    def filled(self, end: int) -> None:
        """The first `end` columns hold KV (`keys`/`values` show them)."""
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]


def batch_cache(model: Any, hits: Sequence[Hit], cached: int, width: int, new_tokens: int) -> DynamicCache:
    """The batch's cache: room for `width` prompt columns and up to `new_tokens` more (growing past them when
    needed); each row's reused prefix (`hits`) in the first `cached` columns, zeros (masked) after it. A model
    whose checks failed at load (internals.py) gets transformers' own layers, holding the same."""
    cache = DynamicCache(config=model.config)
    room = width + min(new_tokens, GROWTH_COLUMNS)
    dtype = getattr(model, KV_DTYPE, None)
    if on_checked_path(model):  # other layer kinds (sliding windows) keep transformers' own behaviour
        cache.layers = [RoomyLayer(room, dtype) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    if not cached:
        return cache
    donor = next(hit for hit in hits if hit.length).runs[0].layers
    for index, layer in enumerate(cache.layers):
        keys, _ = donor[index]
        if isinstance(layer, RoomyLayer):
            layer.open(len(hits), keys.shape[1], keys.shape[3], keys)
            _fill_prefixes(layer, hits, index)
            layer.filled(cached)
        else:
            layer.update(*_prefix_block(hits, index, cached, keys, dtype))
    return cache


def _fill_prefixes(layer: RoomyLayer, hits: Sequence[Hit], index: int) -> None:
    for row, hit in enumerate(hits):
        for start, keys, values in hit.pieces(index):
            layer.fill(row, keys, values, start)


def _prefix_block(hits: Sequence[Hit], index: int, cached: int, like: torch.Tensor,
                  dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer `index`'s reused prefixes as one block of `cached` columns ([rows, heads, cached, head_dim]), zeros
    where a row's prefix is shorter, for a layer of transformers' own."""
    shape = (len(hits), like.shape[1], cached, like.shape[3])
    keys, values = like.new_zeros(shape, dtype=dtype or like.dtype), like.new_zeros(shape, dtype=dtype or like.dtype)
    for row, hit in enumerate(hits):
        for start, own_keys, own_values in hit.pieces(index):
            keys[row, :, start: start + own_keys.shape[2]] = own_keys[0]
            values[row, :, start: start + own_values.shape[2]] = own_values[0]
    return keys, values


def cache_holding(model: Any, layers: Layers) -> DynamicCache:
    """A cache of transformers' own for `model` holding `layers` (per layer: keys and values), to compute more
    tokens after them."""
    cache = DynamicCache(config=model.config)
    for index, (keys, values) in enumerate(layers):
        cache.update(keys, values, index)
    return cache


def shared_columns(hits: Sequence[Hit]) -> int:
    """How many leading columns of the batch's cache will hold the same KV in every row, so that a decode step's
    attention may read them once for all rows (attention.py's `shared_prefix`): the tokens every row's reused
    prefix starts with (the tools prompt), where every row holds the very same keys and values for them; 0 for
    one row, or a short or differing prefix.

    Rows of a batch usually reuse the same runs of the store there (the tree holds the tools prompt once), but a
    row's prefix may have been computed in another batch, in other bits: checking the rest costs one read of the
    prefixes, where every decode step would read them all."""
    length = min((hit.length for hit in hits), default=0)
    if len(hits) < 2 or length < MIN_SHARED_COLUMNS:
        return 0
    for other in hits[1:]:
        length = hits[0].same_columns(other, length)
        if length < MIN_SHARED_COLUMNS:
            return 0
    return length
