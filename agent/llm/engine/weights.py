"""The engine's own layers, put into a loaded model by dtype: which linear layers compute its weights, which
attention its decode steps use, and in which dtype its batch caches hold KV.

    bf16 on a CPU   stacked projections (linear_fused.py), weights packed once for oneDNN (linear_bf16.py)
    fp32 on a CPU   a decode step's short products on every core (linear_fp32.py)
    int8 (a CPU)    stacked projections, then int8 weights (linear_int8.py); KV in bf16 where the CPU computes it
    any CPU         the decode attention (attention.py) instead of sdpa's
    a GPU           transformers' own layers, untouched

Each of them computes what the layer it replaces computes (bit for bit, or within the dtype's rounding: see each
module); none changes what the model is.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from agent.llm.engine import internals
from agent.llm.engine.attention import use_decode_attention
from agent.llm.engine.kv_cache import KV_DTYPE
from agent.llm.engine.linear_bf16 import pack_linears
from agent.llm.engine.linear_fp32 import use_short_input_linears
from agent.llm.engine.linear_fused import fuse_projections
from agent.llm.engine.linear_int8 import quantize_int8

log = logging.getLogger(__name__)


def speed_up(model: Any, *, on_gpu: bool, int8: bool, native_bf16: bool) -> Any:
    """The loaded `model` with the engine's layers in (the same object, but for int8, which replaces layers);
    `int8`: MODEL_DTYPE=int8 (the model was loaded in fp32); `native_bf16`: this CPU computes bf16 natively.

    The private names the engine needs are checked once here (internals.py): before anything changes, that they
    are there; then, with a tiny batch, that the engine's batch cache and decode pass give what transformers'
    forward and cache give (the cache before int8 quantizing: see `cache_mismatch`). Where a check fails, the model
    runs on transformers' own attention, forward and cache (with its linear layers as loaded, where the names were
    missing), and one log line says why.
    """
    failure = internals.missing(model)
    if failure is not None:
        model = quantize_int8(model) if int8 else model
        internals.fall_back(model, failure)
        return model
    if not on_gpu and internals.attention_implementation(model) == "sdpa":
        use_decode_attention(model)  # decode steps without sdpa's copies of the cache (attention.py)
    if not on_gpu and model.dtype == torch.bfloat16:
        fuse_projections(model)  # one product for query/key/value, one for gate/up (linear_fused.py)
        pack_linears(model)  # bf16 weights laid out once, not at every call (linear_bf16.py)
    if not on_gpu and model.dtype == torch.float32 and not int8:
        use_short_input_linears(model)  # a decode step's products on every core (linear_fp32.py)
    if int8:
        fuse_projections(model)  # stacked before quantizing: one int8 product, one activation scale (linear_fused.py)
    failure = internals.cache_mismatch(model)
    if int8:
        model = _in_int8(model, native_bf16)
    failure = failure or internals.pass_mismatch(model)
    if failure is not None:
        internals.fall_back(model, failure)
    return model


def _in_int8(model: Any, native_bf16: bool) -> Any:
    model = quantize_int8(model)
    if native_bf16:  # half the KV's reads and memory, more tokens/s at 8 chats (bench/README.md)
        setattr(model, KV_DTYPE, torch.bfloat16)
        log.info("int8 weights; the KV cache in bf16 (this CPU computes it natively)")
    return model
