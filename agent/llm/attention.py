"""Attention for a decode step on a CPU: one query token per row, as two matrix products.

With the long ReAct prompts of this bot (~1,900 tokens of context per row) a decode step spends as much time in
attention as in the linear layers: every row reads its whole KV cache. PyTorch's CPU `scaled_dot_product_attention`
runs a blocked flash kernel built for long queries; for the one-token query of a decode step it took 0.83 ms a layer
on 8 rows × 1,900 tokens in bf16 (2-core AVX-512 CPU, SmolLM2-135M's 9 query and 3 KV heads), where `q @ kᵀ`,
softmax and `@ v` take 0.31 ms: 15 ms of a 50 ms step. Prompts (more than one query token) stay on sdpa, which is
the faster of the two there.

The query heads that share a KV head are stacked as rows of one product (grouped-query attention without copying
the KV, as transformers' own `pack_gqa` does). Registered with transformers' `AttentionInterface` under `NAME`,
with sdpa's mask; `load_model` selects it for models on the CPU.
"""

from __future__ import annotations

from typing import Any

import torch

NAME = "qwenbot_cpu_decode"


def decode_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: `query` [batch, heads, q, dim], `key`/`value` [batch, kv heads,
    length, dim], a boolean (True: attend) or additive mask; returns [batch, q, heads, dim]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1 or module.training:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # query head h reads KV head h // groups
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * (scaling if scaling is not None else dim ** -0.5)
    if attention_mask is not None:
        mask = attention_mask[..., -1:, : key.shape[2]]  # [batch, 1, 1, length]: broadcast over heads
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    output = torch.matmul(weights, value)  # [batch, kv heads, groups, dim]
    return output.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def use_decode_attention(model: Any) -> None:
    """Make `model` (on the CPU) run its decode steps through `decode_attention`, its prompts through sdpa."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, decode_attention)
    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
