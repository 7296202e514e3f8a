"""The engine's own layers, put into a loaded model by dtype: which linear layers compute its weights, which
attention its decode steps use, and in which dtype its batch caches hold KV.

    bf16 on a CPU   stacked projections (linear_fused.py), weights packed once for oneDNN (linear_bf16.py)
    fp32 on a CPU   a decode step's short products on every core (linear_fp32.py)
    int8 (a CPU)    stacked projections, then int8 weights (linear_int8.py); the rest of the model (embedding,
                    norms, attention, KV) in bf16 where the CPU computes it, else fp32
    int4 (a CPU)    the same with int4 weights (linear_int4.py), the output layer in int8
    any CPU         the decode attention (attention.py) instead of sdpa's
    a GPU           transformers' own layers, untouched

Each of them computes what the layer it replaces computes (bit for bit, or within the dtype's rounding: see each
module); none changes what the model is.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import torch

from agent.llm.engine import forward_pass, internals
from agent.llm.engine.attention import use_decode_attention
from agent.llm.engine.check_record import CheckRecord, fingerprint
from agent.llm.engine.linear_bf16 import pack_linears
from agent.llm.engine.linear_fp32 import use_short_input_linears
from agent.llm.engine.linear_fused import fuse_projections
from agent.llm.engine.linear_int4 import quantize_int4
from agent.llm.engine.linear_int8 import Int8Linear, quantize_int8
from agent.llm.engine.saved_int8 import SavedLevels

log = logging.getLogger(__name__)


def speed_up(model: Any, *, on_gpu: bool, quantize: str | None = None,
             between_layers: Callable[[], Any] | None = None, checks: CheckRecord | None = None,
             saved: SavedLevels | None = None) -> Any:
    """The loaded `model` with the engine's layers in (the same object; quantizing replaces its linear layers);
    `quantize`: "int8" or "int4" (MODEL_DTYPE, or what auto chose), on a model loaded in bf16 or fp32;
    `between_layers` is called after each layer stacked or quantized (loading hands back memory there).

    The private names the engine needs are checked once here (internals.py): before anything changes, that they
    are there; then, with a tiny batch, that the engine's batch cache and decode pass give what transformers'
    forward and cache give (the cache before int8 quantizing: see `cache_mismatch`). Where a check fails, the model
    runs on transformers' own attention, forward and cache (with its linear layers as loaded, where the names were
    missing), and one log line says why. With `checks`, a model that passed the two checks with a batch before
    (same libraries, engine code, model, dtype and CPU: check_record.py) skips them. With `saved`, int8 levels are
    read from there, or saved there once computed (saved_int8.py); a model that skips the checks then stacks its
    projections straight in int8 (the checks' first one runs on the float stacks).
    """
    quantize = _usable(quantize)
    failure = internals.missing(model)
    if failure is not None:
        _quantize(model, quantize, between_layers)
        internals.fall_back(model, failure)
        return model
    if not on_gpu and internals.attention_implementation(model) == "sdpa":
        use_decode_attention(model)  # decode steps without sdpa's copies of the cache (attention.py)
    known = fingerprint(model, quantize) if checks is not None else ""
    passed_before = bool(known) and checks.passed(known)  # type: ignore[union-attr]
    saved = saved if quantize == "int8" else None
    if not on_gpu and (model.dtype == torch.bfloat16 or quantize):
        # one product for query/key/value, one for gate/up (linear_fused.py); stacked before quantizing: one
        # quantized product, one activation scale
        from_saved = passed_before and saved is not None and saved.complete
        fuse_projections(model, between_layers, functools.partial(_saved_stack, saved) if from_saved else None)
    if not on_gpu and model.dtype == torch.bfloat16 and not quantize:
        pack_linears(model)  # bf16 weights laid out once, not at every call (linear_bf16.py)
    if not on_gpu and model.dtype == torch.float32 and not quantize:
        use_short_input_linears(model)  # a decode step's products on every core (linear_fp32.py)
    failure = None if passed_before else internals.cache_mismatch(model)  # on the float model (`cache_mismatch`)
    _quantize(model, quantize, between_layers, saved)
    forward_pass.forget_plans(model)  # the cache check's plans call the layers quantizing replaced
    failure = failure or (None if passed_before else internals.pass_mismatch(model))
    if failure is not None:
        internals.fall_back(model, failure)
    elif known and not passed_before:
        checks.remember(known)  # type: ignore[union-attr]
    return model


def _usable(quantize: str | None) -> str | None:
    """`quantize`, or None where its kernel fails its self-test here (one log line: the layers stay as loaded)."""
    if quantize is None:
        return None
    failure = internals.int8_fails() if quantize == "int8" else internals.int4_fails()
    if failure is None:
        return quantize
    log.warning("%s weights are off, the linear layers stay as loaded: the %s kernel fails its check: %s",
                quantize, quantize, failure)
    return None


def _saved_stack(saved: SavedLevels, name: str, shape: torch.nn.Linear) -> torch.nn.Module | None:
    """Stack `name` in int8 from what was saved of it, or None where nothing is (it is stacked in float)."""
    found = saved.get(name, shape.out_features, shape.in_features)
    return Int8Linear(shape, found) if found is not None else None


def _quantize(model: Any, quantize: str | None, between: Callable[[], Any] | None = None,
              saved: SavedLevels | None = None) -> None:
    output_int8 = bool(quantize) and internals.output_int8_fails() is None
    if quantize == "int4":
        quantize_int4(model, output_in_int8=output_int8, between=between)
    elif quantize == "int8":
        quantize_int8(model, output_weight_only=output_int8, between=between, saved=saved)
    if quantize and model.dtype == torch.bfloat16:
        log.info("%s weights; embedding, norms, attention and KV cache in bf16", quantize)
