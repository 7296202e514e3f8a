"""A decode step's pass through a Llama- or Qwen2-shaped model on the CPU, without transformers' forward around
its modules: the same modules and functions called in the same order, so the same scores bit for bit.

A decode step of a small model on a CPU is mostly the cost of its calls, not of its arithmetic (some 1,600
operations a step of 8 rows for SmolLM2-135M; see bench/README.md § Engine design measurements). transformers'
forward adds its own to every layer: keyword plumbing, output records, the mask built through its mask interface, each
projection a module call. Here, a pass per step:

- builds the boolean mask itself (a row's padding and rejected guesses' holes hidden, its newest columns causal),
  which is what transformers' `sdpa_mask` gives the attention, or what the decode attention builds when given none;
- takes the stacked query/key/value and gate/up products in one call each (linear_fused.py: what the slices would
  take columns of), and rotates query and key heads together in one product, their halves swapped by one `roll`
  (`(-x2, x1) * sin` is `(x2, x1) * (-sin1, sin2)` exactly: a sign, not a rounding);
- calls the decode attention (attention.py) and the cache's layers (kv_cache.py) directly, and each layer's
  modules through calls looked up once (`LayerPlan`).

A step through this pass is faster than through the model's forward (bench/README.md). Only where every
piece is the one mirrored here (`fits`): other models, the GPU (sdpa), sliding windows, offloading hooks and
prompts (whose many tokens make the calls' cost small) keep transformers' forward.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import torch

from agent.llm.engine import own_model
from agent.llm.engine.attention import NAME, SHORT_QUERY, decode_attention
from agent.llm.engine.internals import attention_implementation, has_hooks, on_checked_path
from agent.llm.engine.linear_int4 import Int4Linear
from agent.llm.engine.linear_int8 import Int8Linear, OutputInt8Linear
from agent.llm.engine.kv_cache import RoomyLayer

# The model classes whose forward this pass mirrors: the same layer, attention and MLP code (Qwen2 adds biases
# to query, key and value, which the linear layers carry, and per-layer sliding windows, which `fits` rules out).
MIRRORED = {"LlamaForCausalLM": "LlamaDecoderLayer", "Qwen2ForCausalLM": "Qwen2DecoderLayer"}
# The attribute caching, on the model, each layer's calls (`LayerPlan`), or False where its modules are not the
# mirrored ones: they do not change once it is loaded.
PLANS = "_qwenbot_decode_plans"
# transformers' RMS norms that compute exactly what PyTorch's `rms_norm` does in float32.
RMS_NORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "RmsNorm"}


def fits(model: Any, cache: Any, width: int) -> bool:
    """Whether a pass of `width` tokens per row through `model` over `cache` may run here rather than through the
    model's forward."""
    if width > SHORT_QUERY or attention_implementation(model) != NAME or model.training:
        return False
    if not on_checked_path(model):  # a check at load failed (internals.py): the model's forward
        return False
    return all(type(layer) is RoomyLayer for layer in cache.layers) and bool(_plans(model))


def _plain_layers(model: Any) -> bool:
    """The model's class and every decoder layer's are the mirrored ones, attention over all columns (no sliding
    window), and no hook on any module: accelerate's that move or offload weights, nor PyTorch's own (the pass
    calls some modules' products directly, past their hooks)."""
    if own_model.is_own(model):  # built by the engine from these very modules
        return not any(has_hooks(module) for module in model.modules())
    layer_class = MIRRORED.get(type(model).__name__)
    base = getattr(model, "model", None)
    if layer_class is None or base is None or len(base.layers) != model.config.num_hidden_layers:
        return False
    hooked = any(has_hooks(module) for module in model.modules())
    return not hooked and all(type(layer).__name__ == layer_class
                              and getattr(layer.self_attn, "sliding_window", None) is None
                              for layer in base.layers)


def decode_pass(model: Any, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any, keep: int,
                **attention: Any) -> torch.Tensor:
    """What `model(...)` gives for these inputs as decode_loop.py's `_forward` calls it: the scores of the last `keep`
    columns, as float32. `mask` is the batch's [rows, columns] mask with the pass's own columns last; `attention`:
    keywords for the decode attention (`shared_prefix`)."""
    return model_pass(model, ids, visible_columns(mask, ids.shape[1]), positions, cache, keep, **attention)


def model_pass(model: Any, ids: torch.Tensor, visible: torch.Tensor | None, positions: torch.Tensor, cache: Any,
               keep: int, **attention: Any) -> torch.Tensor:
    """The pass of any width: `visible` is the attention's mask ([rows, 1, width, columns], True where a query may
    attend), or None for its own causal order; the forward of the engine's own models (own_model.py) is this."""
    base = model.model
    hidden = base.embed_tokens(ids)
    cos, sin = base.rotary_emb(hidden, positions)
    rotation = (cos.unsqueeze(2), _signed_halves(sin).unsqueeze(2))  # [rows, width, 1, head dim]: for every head
    attend = decode_attention if attention_implementation(model) == NAME else _transformers_sdpa()
    for plan, layer_cache in zip(_plans(model), cache.layers):  # type: ignore[arg-type]  (a list: `fits` held)
        hidden = hidden + _attend(plan, plan.input_norm(hidden), rotation, visible, layer_cache, attend, attention)
        hidden = hidden + _mlp(plan, plan.post_norm(hidden))
    return model.lm_head(base.norm(hidden[:, -keep:])).float()


def _transformers_sdpa() -> Callable[..., Any]:
    """transformers' sdpa attention: what an own model runs after a failed check (internals.fall_back)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward


class LayerPlan(NamedTuple):
    """One decoder layer's calls, looked up once (a step would otherwise find each module through attribute
    lookups, and call it through `nn.Module.__call__`): each the most direct exact call there is (`_product`,
    `_norm`). With the stacked products (linear_fused.py), their columns: query and key up to `key_end`, value
    `value_start:value_end`; gate up to `gate_end`, up after it."""

    attn: Any
    input_norm: Callable[[torch.Tensor], torch.Tensor]
    post_norm: Callable[[torch.Tensor], torch.Tensor]
    qkv: Callable[[torch.Tensor], torch.Tensor] | None  # the stacked product, or None: `projections` apart
    projections: tuple[Callable[[torch.Tensor], torch.Tensor], ...]  # query, key, value
    key_end: int
    value_start: int
    value_end: int
    output: Callable[[torch.Tensor], torch.Tensor]
    gate_up: Callable[[torch.Tensor], torch.Tensor] | None  # the stacked product, or None: `gate`, `up` apart
    gate: Callable[[torch.Tensor], torch.Tensor]
    up: Callable[[torch.Tensor], torch.Tensor]
    gate_end: int
    down: Callable[[torch.Tensor], torch.Tensor]
    act: Callable[[torch.Tensor], torch.Tensor]
    heads: int
    kv_heads: int
    dim: int


def forget_plans(model: Any) -> None:
    """Drop the layers' calls looked up so far: the engine has replaced layers since (quantizing), and a plan
    would still call the ones it replaced (an own model's forward makes plans at the load's first check)."""
    if hasattr(model, PLANS):
        delattr(model, PLANS)


def _plans(model: Any) -> list[LayerPlan] | bool:
    """Each layer's calls, made at the model's first pass; False for a model whose modules are not mirrored here."""
    plans = getattr(model, PLANS, None)
    if plans is None:
        in_float32 = model.dtype == torch.float32
        plans = _plain_layers(model) and [_layer_plan(layer, in_float32) for layer in model.model.layers]
        setattr(model, PLANS, plans)
    return plans


def _layer_plan(layer: Any, in_float32: bool) -> LayerPlan:
    attn, mlp = layer.self_attn, layer.mlp
    qkv, gate_up = getattr(attn, "qkv_proj", None), getattr(mlp, "gate_up_proj", None)
    return LayerPlan(
        attn=attn, input_norm=_norm(layer.input_layernorm, in_float32),
        post_norm=_norm(layer.post_attention_layernorm, in_float32),
        qkv=_product(qkv.stacked) if qkv is not None else None,
        projections=tuple(_product(part) for part in (attn.q_proj, attn.k_proj, attn.v_proj)),
        key_end=getattr(attn.k_proj, "end", 0), value_start=getattr(attn.v_proj, "start", 0),
        value_end=getattr(attn.v_proj, "end", 0), output=_product(attn.o_proj),
        gate_up=_product(gate_up.stacked) if gate_up is not None else None, gate=_product(mlp.gate_proj),
        up=_product(mlp.up_proj), gate_end=getattr(mlp.gate_proj, "end", 0), down=_product(mlp.down_proj),
        act=mlp.act_fn, heads=attn.config.num_attention_heads, kv_heads=attn.config.num_key_value_heads,
        dim=attn.head_dim)


def _product(module: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """`module`'s forward; for a quantized layer (linear_int8.py, linear_int4.py), its forward called directly
    (past `nn.Module.__call__`: a pass makes some 200 such calls)."""
    return module.forward if type(module) in (Int8Linear, Int4Linear, OutputInt8Linear) else module


def _norm(module: Any, in_float32: bool) -> Callable[[torch.Tensor], torch.Tensor]:
    """The RMS norm; in float32 as PyTorch's own `rms_norm`, one call that makes the same operations as
    transformers' module (the same bits, tested), which are six calls. Not in bf16: the module computes in float32
    and casts back, `rms_norm` does not."""
    if in_float32 and type(module).__name__ in RMS_NORMS:
        return functools.partial(torch.nn.functional.rms_norm, normalized_shape=(module.weight.shape[0],),
                                 weight=module.weight, eps=module.variance_epsilon)
    return module


def visible_columns(mask: torch.Tensor, width: int) -> torch.Tensor:
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


def _attend(plan: LayerPlan, states: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor],
            visible: torch.Tensor | None, layer_cache: Any, attend: Callable[..., Any],
            attention: dict[str, Any]) -> torch.Tensor:
    """The attention block's output: projections, rotary, the cache's update, the attention, the output product."""
    rows, width, _ = states.shape
    heads, kv_heads, dim = plan.heads, plan.kv_heads, plan.dim
    if plan.qkv is not None:  # one product, its slices' columns as they would take them; query and key rotated at once
        qkv = plan.qkv(states)
        rotated = _rotate(qkv[..., : plan.key_end].view(rows, width, heads + kv_heads, dim), rotation)
        query, key = rotated[:, :, :heads], rotated[:, :, heads:]
        value = qkv[..., plan.value_start: plan.value_end].view(rows, width, kv_heads, dim)
    else:
        to_query, to_key, to_value = plan.projections
        query = _rotate(to_query(states).view(rows, width, heads, dim), rotation)
        key = _rotate(to_key(states).view(rows, width, kv_heads, dim), rotation)
        value = to_value(states).view(rows, width, kv_heads, dim)
    keys, values = layer_cache.update(key.transpose(1, 2), value.transpose(1, 2))
    output, _ = attend(plan.attn, query.transpose(1, 2), keys, values, visible, scaling=plan.attn.scaling, **attention)
    return plan.output(output.reshape(rows, width, -1))


def _mlp(plan: LayerPlan, states: torch.Tensor) -> torch.Tensor:
    if plan.gate_up is None:
        return plan.down(plan.act(plan.gate(states)) * plan.up(states))
    gate_up = plan.gate_up(states)  # the slices' columns of it, as they would take them
    return plan.down(plan.act(gate_up[..., : plan.gate_end]) * gate_up[..., plan.gate_end:])
