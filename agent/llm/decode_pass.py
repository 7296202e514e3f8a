"""A decode step's pass through a Llama- or Qwen2-shaped model on the CPU, without transformers' forward around
its modules: the same modules and functions called in the same order, so the same scores bit for bit.

A decode step of a small model on a CPU is mostly the cost of its calls, not of its arithmetic: SmolLM2-135M's step
of 8 rows runs some 1,600 operations, and a model of the same 30 layers with hidden size 64, which has almost no
arithmetic, took 34 ms a step (fp32) against ~90 for the real one (int8) on a 2-core AVX2 CPU. transformers' forward
adds its own to every layer: keyword plumbing, output records, the mask built through its mask interface, each
projection a module call. Here, a pass per step:

- builds the boolean mask itself (a row's padding and draft holes hidden, its newest columns causal), which is
  what transformers' `sdpa_mask` gives the attention, or what the decode attention builds when given none;
- takes the stacked query/key/value and gate/up products in one call each (fused_linear.py: what the slices would
  take columns of), and rotates query and key heads together in one product, their halves swapped by one `roll`
  (`(-x2, x1) * sin` is `(x2, x1) * (-sin1, sin2)` exactly: a sign, not a rounding);
- calls the decode attention (attention.py) and the cache's layers (batch_kv.py) directly.

On a SmolLM2-135M-shaped int8 model, 8 rows over 900 cached columns, interleaved: 79-95 ms a step against 89-106
through the model's forward. Only where every piece is the one mirrored here (`fits`): other models, the GPU
(sdpa), sliding windows, offloading hooks and prompts (whose many tokens make the calls' cost small) keep
transformers' forward.
"""

from __future__ import annotations

from typing import Any

import torch

from agent.llm.attention import NAME, SHORT_QUERY, decode_attention
from agent.llm.batch_kv import RoomyLayer

# The model classes whose forward this pass mirrors: the same layer, attention and MLP code (Qwen2 adds biases
# to query, key and value, which the linear layers carry, and per-layer sliding windows, which `fits` rules out).
MIRRORED = {"LlamaForCausalLM": "LlamaDecoderLayer", "Qwen2ForCausalLM": "Qwen2DecoderLayer"}
# The attribute caching, on the model, whether its modules are the mirrored ones (they do not change once loaded).
PLAIN_LAYERS = "_qwenbot_plain_layers"


def fits(model: Any, cache: Any, width: int) -> bool:
    """Whether a pass of `width` tokens per row through `model` over `cache` may run here rather than through the
    model's forward."""
    if width > SHORT_QUERY or getattr(model.config, "_attn_implementation", None) != NAME or model.training:
        return False
    if not all(type(layer) is RoomyLayer for layer in cache.layers):
        return False
    plain = getattr(model, PLAIN_LAYERS, None)
    if plain is None:
        plain = _plain_layers(model)
        setattr(model, PLAIN_LAYERS, plain)
    return plain


def _plain_layers(model: Any) -> bool:
    """The model's class and every decoder layer's are the mirrored ones, attention over all columns (no sliding
    window), and no accelerate hook moves or offloads anything between the layers."""
    layer_class = MIRRORED.get(type(model).__name__)
    base = getattr(model, "model", None)
    if layer_class is None or base is None or len(base.layers) != model.config.num_hidden_layers:
        return False
    hooked = [module for module in (model, base, *base.layers) if hasattr(module, "_hf_hook")]
    return not hooked and all(type(layer).__name__ == layer_class
                              and getattr(layer.self_attn, "sliding_window", None) is None
                              for layer in base.layers)


def decode_pass(model: Any, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any, keep: int,
                **attention: Any) -> torch.Tensor:
    """What `model(...)` gives for these inputs as decoding.py's `_forward` calls it: the scores of the last `keep`
    columns, as float32. `mask` is the batch's [rows, columns] mask with the pass's own columns last; `attention`:
    keywords for the decode attention (`shared_prefix`)."""
    base = model.model
    hidden = base.embed_tokens(ids)
    cos, sin = base.rotary_emb(hidden, positions)
    rotation = (cos.unsqueeze(2), _signed_halves(sin).unsqueeze(2))  # [rows, width, 1, head dim]: for every head
    visible = _visible(mask, ids.shape[1])
    for index, layer in enumerate(base.layers):
        states = layer.input_layernorm(hidden)
        hidden = hidden + _attend(layer.self_attn, states, rotation, visible, cache.layers[index], attention)
        states = layer.post_attention_layernorm(hidden)
        hidden = hidden + _mlp(layer.mlp, states)
    return model.lm_head(base.norm(hidden[:, -keep:])).float()


def _visible(mask: torch.Tensor, width: int) -> torch.Tensor:
    """[rows, 1, width, columns], True where a query may attend: the row's columns (mask) up to its own position."""
    columns = mask.shape[1]
    queries = torch.arange(columns - width, columns, device=mask.device)
    causal = torch.arange(columns, device=mask.device)[None, :] <= queries[:, None]
    return mask.bool()[:, None, None, :] & causal[None, None]


def _signed_halves(sin: torch.Tensor) -> torch.Tensor:
    """`sin` with its first half negated: `roll(x) * this` is rotate_half(x) * sin, bit for bit."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def _rotate(heads: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """transformers' `apply_rotary_pos_emb` on [rows, width, heads, head dim]: x·cos + rotate_half(x)·sin."""
    cos, signed_sin = rotation
    return heads * cos + heads.roll(heads.shape[-1] // 2, dims=-1) * signed_sin


def _attend(attn: Any, states: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor], visible: torch.Tensor,
            layer_cache: Any, attention: dict[str, Any]) -> torch.Tensor:
    """The attention block's output: projections, rotary, the cache's update, the attention, the output product."""
    rows, width, _ = states.shape
    dim = attn.head_dim
    query_heads, kv_heads = attn.config.num_attention_heads, attn.config.num_key_value_heads
    stacked = getattr(attn, "qkv_proj", None)
    if stacked is not None:  # one product, its slices' columns as they would take them; query and key rotated at once
        qkv = stacked.stacked(states)
        rotated = _rotate(qkv[..., : attn.k_proj.end].view(rows, width, query_heads + kv_heads, dim), rotation)
        query, key = rotated[:, :, :query_heads], rotated[:, :, query_heads:]
        value = qkv[..., attn.v_proj.start: attn.v_proj.end].view(rows, width, kv_heads, dim)
    else:
        query = _rotate(attn.q_proj(states).view(rows, width, query_heads, dim), rotation)
        key = _rotate(attn.k_proj(states).view(rows, width, kv_heads, dim), rotation)
        value = attn.v_proj(states).view(rows, width, kv_heads, dim)
    keys, values = layer_cache.update(key.transpose(1, 2), value.transpose(1, 2))
    output, _ = decode_attention(attn, query.transpose(1, 2), keys, values, visible, scaling=attn.scaling,
                                 **attention)
    return attn.o_proj(output.reshape(rows, width, -1))


def _mlp(mlp: Any, states: torch.Tensor) -> torch.Tensor:
    stacked = getattr(mlp, "gate_up_proj", None)
    if stacked is None:
        return mlp.down_proj(mlp.act_fn(mlp.gate_proj(states)) * mlp.up_proj(states))
    gate_up = stacked.stacked(states)  # the slices' columns of it, as they would take them
    gate, up = (gate_up[..., part.start: part.end] for part in (mlp.gate_proj, mlp.up_proj))
    return mlp.down_proj(mlp.act_fn(gate) * up)
