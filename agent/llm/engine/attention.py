"""Attention on a CPU as matrix products over the KV cache: a decode step's one token per row, or a few (its
speculative tokens, see speculative.py), and in bf16 the prompts too.

With the long ReAct prompts of this bot (~900-1,900 tokens of context per row) a decode step spends as much time in
attention as in the linear layers: every row reads its whole KV cache. PyTorch's CPU `scaled_dot_product_attention`
runs a blocked flash kernel built for long queries, copies the batch cache's views, and transformers copies the KV
three times over first for grouped-query models when a query has more than one token (`repeat_kv`). Products
over the cache make a decode step faster than sdpa, the more so the more rows (see bench/README.md § Engine design
measurements, "The decode attention").

A prompt's new tokens over a long cached prefix (a chat's next question and observation over the tools prompt) are a
wide, short product, which in bf16 goes faster as products a chunk of query tokens at a time than through sdpa's flash
kernel, with the softmax in bf16 (it sums in fp32 inside). fp32 prompts stay on sdpa's kernel (MODEL_DTYPE=float32 is
the exact mode; in fp32 it beats the products), and so does a prompt computed whole with no mask (transformers then asks
sdpa for a causal one, whose kernel skips the masked half); given a mask, sdpa reads the grouped KV heads in place
(`_sdpa`).

The query heads that share a KV head are stacked as rows of one product (grouped-query attention without copying
the KV, as transformers' own `pack_gqa` does). The rows of a batch that reuse one prefix (the tools prompt every
chat starts with) hold the same KV for it: a decode step reads those columns once for all rows, not once a row
(`_short_query_over_shared`; the pass is told how many through `SHARED_COLUMNS`). Registered with transformers'
`AttentionInterface` under `NAME`, with sdpa's mask; `load_model` selects it for models on the CPU.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from agent.llm.engine import own_model
from agent.llm.engine.internals import attention_implementation, use_attention

NAME = "qwenbot_cpu_decode"
# Queries of up to this many tokens take the decode step's path; longer ones are prompts.
SHORT_QUERY = 16
# The most scores a prompt's chunk of query tokens holds at once, per layer: 16 MB in bf16 (8 rows × 9 heads ×
# 1,000 columns: 116 query tokens a chunk).
PROMPT_SCORES = 1 << 23
# A cache's whole room is read when its spare columns are at most a fifth of its filled ones (`_whole_room`).
SPARE_SHARE = 5
# The keyword a pass gives the attention (through the model's forward) naming how many leading columns of the
# batch's cache hold the same KV in every row (`shared_prefix`).
SHARED_COLUMNS = "qwenbot_shared_columns"


def decode_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: `query` [batch, heads, q, dim], `key`/`value` [batch, kv heads,
    length, dim], a boolean (True: attend) or additive mask, or None for a plain causal one; returns
    [batch, q, heads, dim]. `SHARED_COLUMNS` in `kwargs`: that many leading columns hold the same KV in every row,
    and every query sees them (a reused prefix, before any row's padding and the pass's own tokens)."""
    shared = kwargs.pop(SHARED_COLUMNS, 0)
    if key.dtype != query.dtype:  # a cache kept in a narrower dtype than the model computes in (kv_cache.py)
        output, _ = decode_attention(module, query.to(key.dtype), key, value, attention_mask, scaling, dropout,
                                     **kwargs, **{SHARED_COLUMNS: shared})
        return output.to(query.dtype), None
    width = query.shape[2]
    # sdpa for fp32 prompts, and for a whole prompt with no mask (its flash kernel skips the masked half then).
    if module.training or (width > SHORT_QUERY and (key.dtype != torch.bfloat16 or attention_mask is None)):
        return _sdpa(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    batch, heads, _, dim = query.shape
    length = key.shape[2]
    key, value = _whole_room(key), _whole_room(value)
    kv_heads, room = key.shape[1], key.shape[2]
    sizes = (batch, kv_heads, heads // kv_heads, width, length, room)
    scale = scaling if scaling is not None else dim ** -0.5
    # Rows and KV heads merge into the products' batch without copying the cache.
    keys, values = key.reshape(batch * kv_heads, room, dim), value.reshape(batch * kv_heads, room, dim)
    short = width <= SHORT_QUERY
    hidden = _hidden_columns(attention_mask, sizes, key.dtype, key.device, expanded=short)
    if short and batch > 1 and 0 < shared <= length and key.dtype != torch.bfloat16:
        output = _short_query_over_shared(query, key, value, hidden, sizes, scale, shared)
    else:
        attend = _short_query if short else _prompt
        output = attend(query, keys, values, hidden, sizes, scale)
    return output.transpose(1, 2).contiguous(), None


def _sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
          attention_mask: torch.Tensor | None, scaling: float | None, dropout: float,
          **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, except that a masked query reads the grouped KV heads in place.

    Given a mask, transformers copies each KV head once for each of its query heads (`repeat_kv`) and keeps sdpa's
    `enable_gqa` for unmasked calls (CUDA's kernels fall back to plain math with a mask); PyTorch's CPU flash
    kernel takes a mask with `enable_gqa` and gives the very same output, bit for bit, without the copy (a fifth
    to a third of a masked prompt's attention: bench/README.md)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if module.training or attention_mask is None or groups == 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                              scale=scaling, enable_gqa=True)
    return output.transpose(1, 2).contiguous(), None


def _short_query(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, hidden: torch.Tensor,
                 sizes: tuple[int, ...], scale: float) -> torch.Tensor:
    """A decode step's attention, [batch, heads, width, dim]: query head h reads KV head h // groups, so its rows
    go with that head's (`groups × width` of them) in one product per row and KV head."""
    batch, kv_heads, groups, width, _, _ = sizes
    grouped = query.reshape(batch * kv_heads, groups * width, query.shape[-1])
    # The mask's add and the scaling in the product itself, and the softmax over the scores' last (contiguous)
    # dimension: faster than a separate scaling, masking and a softmax across a transposed product (bench/README.md).
    scores = torch.baddbmm(hidden, grouped, keys.transpose(1, 2), alpha=scale)
    output = torch.bmm(torch.softmax(scores, dim=-1), values)
    return output.view(batch, kv_heads * groups, width, query.shape[-1])


def _short_query_over_shared(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, hidden: torch.Tensor,
                             sizes: tuple[int, ...], scale: float, shared: int) -> torch.Tensor:
    """`_short_query` for a batch whose first `shared` columns hold the same KV in every row (the tools prompt
    the chats share): every row's queries read those columns once, from the first row, as one product, and only
    the rest of each row's own. The scores are joined for one softmax, so it is the same attention, summed in
    two parts, and the shared columns are read once instead of once a row (bench/README.md). `key`/`value` are
    [batch, kv heads, room, dim] views.

    Not for a bf16 cache: oneDNN copies a product's input that is not contiguous (see `_whole_room`), and each
    row's own columns are not once the shared ones are cut out of the room."""
    batch, kv_heads, groups, width, _, room = sizes
    dim = query.shape[-1]
    rows = groups * width  # one row's queries per KV head
    grouped = query.reshape(batch, kv_heads, rows, dim)
    # The shared columns once: all rows' queries of a KV head stacked, [kv heads, batch × rows, dim].
    stacked = grouped.transpose(0, 1).reshape(kv_heads, batch * rows, dim)
    shared_keys, shared_values = key[0, :, :shared], value[0, :, :shared]
    shared_scores = torch.bmm(stacked, shared_keys.transpose(1, 2)).mul_(scale)
    own_keys = key[:, :, shared:].reshape(batch * kv_heads, room - shared, dim)
    own_values = value[:, :, shared:].reshape(batch * kv_heads, room - shared, dim)
    own_scores = torch.baddbmm(hidden[..., shared:], grouped.reshape(batch * kv_heads, rows, dim),
                               own_keys.transpose(1, 2), alpha=scale)
    by_row = shared_scores.view(kv_heads, batch, rows, shared).transpose(0, 1).reshape(batch * kv_heads, rows,
                                                                                     shared)
    weights = torch.softmax(torch.cat([by_row, own_scores], dim=-1), dim=-1)
    output = torch.bmm(weights[..., shared:], own_values)
    shared_weights = weights[..., :shared].reshape(batch, kv_heads, rows, shared).transpose(0, 1)
    from_shared = torch.bmm(shared_weights.reshape(kv_heads, batch * rows, shared), shared_values)
    output.view(batch, kv_heads, rows, dim).add_(from_shared.view(kv_heads, batch, rows, dim).transpose(0, 1))
    return output.view(batch, kv_heads * groups, width, dim)


def _prompt(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, hidden: torch.Tensor,
            sizes: tuple[int, ...], scale: float) -> torch.Tensor:
    """A prompt's attention in bf16, [batch, heads, width, dim], a chunk of query tokens at a time so that a
    chunk's scores hold at most `PROMPT_SCORES` values (faster than sdpa's flash kernel in bf16: bench/README.md)."""
    batch, kv_heads, groups, width, _, room = sizes
    dim = query.shape[-1]
    chunk = max(1, PROMPT_SCORES // (batch * kv_heads * groups * room))
    scaled = (query * scale).view(batch, kv_heads, groups, width, dim)
    output = query.new_empty(batch, kv_heads * groups, width, dim)
    for start in range(0, width, chunk):
        end = min(width, start + chunk)
        rows = scaled[:, :, :, start:end].reshape(batch * kv_heads, groups * (end - start), dim)
        scores = torch.bmm(rows, keys.transpose(1, 2))
        scores.view(batch, kv_heads, groups, end - start, room).add_(hidden[..., start:end, :])
        part = torch.bmm(torch.softmax(scores, dim=-1), values)
        output[:, :, start:end] = part.view(batch, kv_heads * groups, end - start, dim)
    return output


def _whole_room(states: torch.Tensor) -> torch.Tensor:
    """`states` ([batch, kv heads, length, dim]) widened to all the columns of the tensor it is a view of, where it
    is the filled part of a batch cache's room (kv_cache.py's `RoomyLayer`); otherwise `states` itself.

    oneDNN's bf16 batched product copies an input that is not contiguous, and the filled columns of a roomy cache
    are not (each row's room lies between them): hundreds of MB a pass. The whole room is contiguous; its unfilled
    columns are zeros that the mask hides (or a rewound step's KV, hidden too). Worth it while they are few (at most
    a fifth of the filled ones: `SPARE_SHARE`); the batch's cache grows 128 columns at a time.

    Not in float32, whose batched products read the strided view in place: there the spare columns would only be
    read for nothing (both: see bench/README.md)."""
    batch, heads, length, dim = states.shape
    room = states.stride(1) // dim
    if (states.dtype != torch.bfloat16 or states.is_contiguous() or states.storage_offset()
            or room > length + length // SPARE_SHARE
            or states.stride() != (heads * room * dim, room * dim, dim, 1)
            or states.untyped_storage().nbytes() < batch * heads * room * dim * states.element_size()):
        return states
    return states.as_strided((batch, heads, room, dim), states.stride())


class _LastMask(threading.local):
    """The additive mask of the pass running on this thread: the model gives every layer the same mask."""

    mask: torch.Tensor | None = None
    shape: tuple[Any, ...] = ()
    hidden: torch.Tensor | None = None


_last = _LastMask()


def _hidden_columns(attention_mask: torch.Tensor | None, sizes: tuple[int, ...], dtype: torch.dtype,
                    device: Any, expanded: bool) -> torch.Tensor:
    """What the scores add to hide the columns a query may not see: 0 where it attends, the lowest finite value
    where not; as [batch or 1, 1, 1, width, room], or `expanded` to the products' [batch × KV heads, groups ×
    width, room]. `sizes` is (batch, KV heads, groups, width, length, room). Built once a pass, at its first
    layer: the memo holds the mask it came from, so a new pass's mask (a new tensor) is never taken for the last
    one."""
    shape = (*sizes, dtype, device, expanded)
    if _last.mask is attention_mask and _last.shape == shape and _last.hidden is not None:
        return _last.hidden
    batch, kv_heads, groups, width, length, room = sizes
    visible = _visible(attention_mask, width, length, room, device)
    if visible.dtype == torch.bool:
        # The lowest finite value, not -inf: a query on a padding column sees nothing, and -inf would make its
        # output NaN, which its KV then carries into every later layer (0 × NaN is NaN even where it is hidden).
        hidden = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill(~visible, torch.finfo(dtype).min)
    else:  # an additive mask: its -inf or float32 minimum held as this dtype's lowest finite value
        hidden = visible.to(dtype).clamp(min=torch.finfo(dtype).min)
    if expanded:
        hidden = hidden.expand(batch, kv_heads, groups, width, room).reshape(batch * kv_heads, groups * width, room)
    _last.mask, _last.shape, _last.hidden = attention_mask, shape, hidden
    return hidden


def _visible(attention_mask: torch.Tensor | None, width: int, length: int, room: int, device: Any) -> torch.Tensor:
    """The mask as [batch or 1, 1, 1, width, room]: the model's own, or causal when it gave none (transformers
    leaves it out where the mask would only be causal); the columns past `length` hidden."""
    if attention_mask is not None:
        mask = attention_mask[:, :, -width:, :length].unsqueeze(1)
        if room == length:
            return mask
        hidden = False if mask.dtype == torch.bool else torch.finfo(mask.dtype).min
        return torch.nn.functional.pad(mask, (0, room - length), value=hidden)
    columns = torch.arange(room, device=device)
    queries = torch.arange(length - width, length, device=device)
    return (columns[None, :] <= queries[:, None])[None, None, None]


def shared_prefix(model: Any, columns: int) -> dict[str, int]:
    """The keyword arguments telling a pass of `model` that the batch's first `columns` columns hold the same KV
    in every row; none where its attention is not `decode_attention` (others would not know the keyword)."""
    return {SHARED_COLUMNS: columns} if columns and _uses_decode_attention(model) else {}


def reads_shared_prefix(model: Any, kv_dtype: torch.dtype) -> bool:
    """Whether a decode step of `model` over a cache in `kv_dtype` reads shared columns once (not in bf16: see
    `_short_query_over_shared`), so that finding them (kv_cache.py's `shared_columns`) is worth its read."""
    return _uses_decode_attention(model) and kv_dtype != torch.bfloat16


def _uses_decode_attention(model: Any) -> bool:
    return attention_implementation(model) == NAME


def use_decode_attention(model: Any) -> None:
    """Make `model` (on the CPU) run its decode steps through `decode_attention`, its prompts through sdpa."""
    if not own_model.is_own(model):  # transformers' model classes look their attention function up by name
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(NAME, decode_attention)
        if NAME not in ALL_MASK_ATTENTION_FUNCTIONS:
            AttentionMaskInterface.register(NAME, sdpa_mask)
    use_attention(model, NAME)
