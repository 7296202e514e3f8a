"""Every private name of transformers and torch the engine relies on, in this one module, checked once at load.

    private name                                     what the engine does with it                 used by
    config._attn_implementation                      which attention function a model runs        attention.py,
                                                                                                  forward_pass.py,
                                                                                                  weights.py,
                                                                                                  own_model.py
    Module._forward_hooks, _forward_pre_hooks,       a module with a hook keeps the model's own   forward_pass.py
      accelerate's _hf_hook                          forward (the pass calls past hooks)
    torch.ops.onednn.qlinear_prepack,                int8 weights packed for oneDNN, and their    linear_int8.py
      qlinear_pointwise                              product with uint8 activations
    torch.ops.mkldnn.data_ptr, _nbytes,              a packed int8 weight's bytes and layout,     linear_int8.py,
      _get_mkldnn_serialized_md                      saved once (a later start maps them back)    saved_int8.py
    torch._C._cpu._get_cpu_capability                the CPU's features, in the saved layout's key
    libtorch's aoti_torch_create_tensor_from_blob_v2 a packed weight over bytes already laid out
      (AOTInductor's C shim, through ctypes),        (what AOTInductor does with the packed
      torch._C._aoti.alloc_tensor_by_stealing_...    weights it compiles in)
    torch.ops.aten._weight_int8pack_mm               the output layer's int8 weights, activations linear_int8.py
                                                     as they are
    torch.ops.aten._convert_weight_to_int4pack_for_cpu,  int4 weights packed for torch's CPU      linear_int4.py
      _weight_int4pack_mm_for_cpu                    kernel, and their product
    torch.ops.mkldnn._reorder_linear_weight,         bf16 weights laid out once for oneDNN        linear_bf16.py
      _linear_pointwise
    DynamicLayer.lazy_initialization                 a batch cache layer of our own (CacheLayer)  kv_cache.py

(A cache is filled through the public `Cache.update`, not DynamicCache's `ddp_cache_data`.)

An upgrade of either library may rename or change any of these. So the engine checks them once, where it loads a
model (weights.py), on the loaded model itself with a tiny batch (two rows, one padded; a prompt, then two steps):

    missing          before the model changes: the names are there
    cache_mismatch   the model's forward over the engine's batch cache gives its scores over transformers' own
                     cache (within rounding), and holds the first layer's keys and values bit for bit
    pass_mismatch    the decode pass (forward_pass.py) gives the model's forward's scores, bit for bit
    packing_fails    a packed bf16 layer gives `F.linear`'s outputs on the model's own first weight
    int8_fails,      before quantizing (MODEL_DTYPE=int8, int4): a small layer of their own through the kernel
      int4_fails,    gives `F.linear` over its de-quantized weight, within the activations' rounding
      output_int8_fails
    int8_layout      a packed int8 weight rebuilt over a copy of its bytes gives its products bit for bit (else
                     int8 levels are saved instead of packed bytes: saved_int8.py)

Where one of the first three fails, `fall_back` puts the model on transformers' own attention, forward and cache,
and logs one line naming what failed: an upgrade may cost speed, never correctness. Where packing fails, the bf16
layers stay plain (also one line); where an int8 or int4 kernel fails, the layers stay as loaded (bf16 or fp32),
with one line: more memory and less speed, the same model.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
from typing import Any, Callable

import torch
from transformers.cache_utils import DynamicLayer

log = logging.getLogger(__name__)

# A model attribute: why this model runs on transformers' own forward and cache (absent: the engine's checks held).
PLAIN = "qwenbot_plain"
# The step check's scores may differ from the reference's by this share of the reference's largest score: the
# rounding of another summation order (bf16 or a bf16 KV cache in the engine's path), not a different computation.
STEP_TOLERANCE = 0.02  # a broken mask gave 0.14 (fp32); a sound cache gives 0 on the CPU


# ── the private names, each used here only ─────────────────────────────────────────────────────────────────────

def attention_implementation(model: Any) -> str | None:
    """The name of the attention function `model` runs (transformers keeps it on the config)."""
    return getattr(model.config, "_attn_implementation", None)


def configure_attention(config: Any, name: str) -> None:
    """Name the attention function a model of `config` runs, on the config."""
    config._attn_implementation = name


def use_attention(model: Any, name: str) -> None:
    """Make `model` run the attention function registered as `name`: transformers' classes through their public
    setter (named like the private field), the engine's own (own_model.py, which has none) on the config."""
    setter = getattr(model, "set_attn_implementation", None)
    if setter is None:
        configure_attention(model.config, name)
    else:
        setter(name)


def has_hooks(module: Any) -> bool:
    """Whether `module` has a hook: accelerate's (moving or offloading weights) or PyTorch's own."""
    return bool(hasattr(module, "_hf_hook") or module._forward_hooks or module._forward_pre_hooks)


def int8_pack(levels: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An int8 weight ([out, in] levels, float32 scale per output) laid out once for oneDNN's int8 product: (the
    packed weight, its scales, its zero points). The packed weight is oneDNN's own opaque tensor, one byte a weight."""
    zero_points = torch.zeros(levels.shape[0], dtype=torch.long)
    return torch.ops.onednn.qlinear_prepack(levels, None), scales, zero_points


def int8_linear(activations: torch.Tensor, zero_point: int, packed: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                out_dtype: torch.dtype) -> torch.Tensor:
    """The product of uint8 `activations` [rows, in] (each `level + zero_point`, scale 1) with an `int8_pack`ed
    weight, in `out_dtype`: sums of integers, exact, times each output's weight scale."""
    weight, scales, zero_points = packed
    return torch.ops.onednn.qlinear_pointwise(activations, 1.0, zero_point, weight, scales, zero_points, None, 1.0, 0,
                                              out_dtype, "none", [], "")


def int8_packed_bytes(packed: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """An `int8_pack`ed weight's bytes as oneDNN laid them out (a uint8 view of its memory: valid while the weight
    lives) and their layout (oneDNN's serialized memory descriptor, uint8)."""
    weight = packed[0]
    size = torch.ops.mkldnn._nbytes(weight)
    memory = (ctypes.c_uint8 * size).from_address(torch.ops.mkldnn.data_ptr(weight))
    return torch.frombuffer(memory, dtype=torch.uint8), torch.ops.mkldnn._get_mkldnn_serialized_md(weight)


def int8_packed_from_bytes(raw: torch.Tensor, layout: torch.Tensor, scales: torch.Tensor,
                           in_features: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What `int8_pack` gave for a weight whose packed bytes and layout `int8_packed_bytes` gave on this CPU with
    this torch (`int8_layout` says which), built over `raw` with no copy: `raw` must outlive it. AOTInductor builds
    the packed weights it compiles into a model the same way."""
    create = _aoti_shim().aoti_torch_create_tensor_from_blob_v2
    sizes = (ctypes.c_int64 * 2)(in_features, scales.shape[0])  # as packed: [in, out]
    strides = (ctypes.c_int64 * 2)(scales.shape[0], 1)
    described = bytes(layout.tolist())
    handle = ctypes.c_void_p()
    failed = create(raw.data_ptr(), 2, sizes, strides, 0, _AOTI_INT8, _AOTI_CPU, 0, ctypes.byref(handle),
                    _AOTI_MKLDNN, described, len(described))
    if failed or not handle.value:
        raise RuntimeError("libtorch could not build a packed weight over saved bytes")
    weight = torch._C._aoti.alloc_tensor_by_stealing_from_void_ptr(_capsule(handle.value))
    return weight, scales, torch.zeros(scales.shape[0], dtype=torch.long)


# The shim's codes for int8, the CPU and oneDNN's layout (its aoti_torch_dtype_int8() and the like, constant).
_AOTI_INT8, _AOTI_CPU, _AOTI_MKLDNN = 1, 0, 3


@functools.cache
def _aoti_shim() -> ctypes.CDLL:
    import os

    library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    for name, code in (("aoti_torch_dtype_int8", _AOTI_INT8), ("aoti_torch_device_type_cpu", _AOTI_CPU),
                       ("aoti_torch_layout__mkldnn", _AOTI_MKLDNN)):
        getattr(library, name).restype = ctypes.c_int32
        if getattr(library, name)() != code:
            raise RuntimeError(f"libtorch's {name}() is no longer {code}")
    create = library.aoti_torch_create_tensor_from_blob_v2
    int64, int32, pointer = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p
    create.argtypes = [pointer, int64, ctypes.POINTER(int64), ctypes.POINTER(int64), int64, int32, int32, int32,
                       ctypes.POINTER(pointer), int32, ctypes.c_char_p, int64]
    create.restype = int32
    return library


def _capsule(address: int) -> Any:
    """A PyCapsule around `address` (torch takes a tensor handle from C in one)."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(address, None, None)


@functools.cache
def int8_activation_bits() -> int:
    """8 where oneDNN's int8 product takes 8-bit activations without overflow on this CPU, else 7.

    Without VNNI the x86 int8 kernels sum pairs of 8-bit products in 16 bits, which saturate at full range (uint8
    activations up to 255 against weights at ±127); with VNNI (or AMX) the sums are 32-bit. The eighth bit halves the
    rounding of every activation (on the test model 46% of float32's tokens kept instead of 12%: bench/README.md §
    MODEL_DTYPE). Tried once, on the product that overflows: every activation and every weight at its largest level."""
    try:
        packed = int8_pack(torch.full((16, 64), 127, dtype=torch.int8), torch.full((16,), 0.05 / 127))
        top = torch.full((1, 64), 255, dtype=torch.uint8)  # level 127 above the zero point 128
        got = int8_linear(top, 128, packed, torch.float32)
    except (AttributeError, RuntimeError, NotImplementedError):
        return 7
    expected = 64 * 127 * 0.05  # 64 products of level 127 (scale 1) and 0.05
    return 8 if float((got - expected).abs().max()) < 0.01 * expected else 7


def int8_weight_only_linear(flat: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """`F.linear` of 2-D `flat` (bf16 or fp32) with an int8 weight [out, in] and its per-output scales (in
    `flat`'s dtype), the activations left as they are: each row computed on its own."""
    return torch.ops.aten._weight_int8pack_mm(flat, weight, scales)


def int4_pack(levels: torch.Tensor) -> torch.Tensor:
    """int4 levels ([out, in] int32 in 0..15) laid out for torch's CPU int4 kernel (a layout of this CPU's own:
    made at load, never saved)."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels.to(torch.int32).contiguous(), 1)


def int4_linear(flat: torch.Tensor, packed: torch.Tensor, group: int, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """`F.linear` of 2-D bf16 `flat` with an `int4_pack`ed weight, each group of `group` inputs de-quantized as
    `(level - 8) * scale + zero` ([in / group, out, 2] bf16). Each row is computed on its own: the same outputs
    whatever else the batch holds."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(flat, packed, group, scales_and_zeros)


def pack_bf16_weight(weight: torch.Tensor) -> torch.Tensor:
    """A bf16 weight reordered once into oneDNN's blocked layout (what PyTorch's compiler does for frozen models)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 1)


def packed_bf16_linear(flat: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear` of 2-D `flat` with a weight `pack_bf16_weight` laid out."""
    return torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")


class CacheLayer(DynamicLayer):
    """A cache layer of the engine's own, seen by transformers as a `DynamicLayer`: `open_like` allocates it from
    the first keys it is given (transformers calls that hook `lazy_initialization`)."""

    def open_like(self, key_states: torch.Tensor) -> None:
        """Allocate the layer for keys shaped and typed like `key_states`."""
        raise NotImplementedError

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.open_like(key_states)


# ── the checks at load ─────────────────────────────────────────────────────────────────────────────────────────

def on_checked_path(model: Any) -> bool:
    """Whether `model` may run through the engine's own cache and decode pass (no check failed for it)."""
    return not getattr(model, PLAIN, "")


def missing(model: Any) -> str | None:
    """What the engine needs that this transformers or torch lacks, or None: checked before the model changes."""
    try:
        if not isinstance(attention_implementation(model), str):
            return "the model's config does not say its attention implementation (config._attn_implementation)"
        has_hooks(model)
    except AttributeError as error:
        return f"{type(error).__name__}: {error}"
    if not callable(getattr(DynamicLayer, "lazy_initialization", None)):
        return "transformers' DynamicLayer has no lazy_initialization"
    return None


def packing_fails(linear: torch.nn.Linear) -> str | None:
    """Why `linear` (bf16, on the CPU) cannot be packed here: the kernel is missing or gives other outputs than
    `F.linear`; None when a few rows through it give exactly what `F.linear` gives."""
    try:
        probe = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0)).to(linear.weight.dtype)
        with torch.inference_mode():
            packed = packed_bf16_linear(probe, pack_bf16_weight(linear.weight), linear.bias)
            expected = torch.nn.functional.linear(probe, linear.weight, linear.bias)
    except (AttributeError, RuntimeError) as error:  # no mkldnn ops in this build, or no bf16 support in them
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    return None if torch.equal(packed, expected) else "the packed product differs from F.linear"


def int8_fails() -> str | None:
    """Why the int8 product cannot be used here (its ops gone, or not giving `F.linear` over the de-quantized
    weight within the activations' rounding), or None."""
    from agent.llm.engine import linear_int8

    return _kernel_fails(linear_int8.Int8Linear, linear_int8.TOLERANCE)


def int4_fails() -> str | None:
    """Why the int4 product cannot be used here, or None (as `int8_fails`)."""
    from agent.llm.engine import linear_int4

    return _kernel_fails(linear_int4.Int4Linear, linear_int4.TOLERANCE)


def output_int8_fails() -> str | None:
    """Why the output layer's int8 product (weights only) cannot be used here, or None (as `int8_fails`)."""
    from agent.llm.engine import linear_int8

    return _kernel_fails(linear_int8.OutputInt8Linear, linear_int8.OUTPUT_TOLERANCE)


@functools.cache
def int8_layout() -> str | None:
    """Which packed layout this CPU and torch give int8 weights (a short hash of oneDNN's layout of a probe
    weight, and torch's version), where a packed weight rebuilt over a copy of its bytes (`int8_packed_from_bytes`)
    gives the same products as the weight itself, bit for bit; None where it does not or cannot (then saved_int8.py
    saves levels, to be packed at every start). The layout is oneDNN's choice for this CPU's instructions, and a
    weight's bytes read in another layout compute garbage without an error: bytes packed on another CPU or torch are
    never read here (saved_int8.py keys its folders by this hash, which covers the CPU's every capability)."""
    generator = torch.Generator().manual_seed(0)
    levels = torch.randint(-127, 128, (96, 160), dtype=torch.int8, generator=generator)
    probe = torch.randint(0, 256, (5, 160), dtype=torch.uint8, generator=generator)
    try:
        packed = int8_pack(levels, torch.rand(96, generator=generator) / 100)
        raw, layout = int8_packed_bytes(packed)
        copy = raw.clone()
        rebuilt = int8_packed_from_bytes(copy, layout, packed[1], levels.shape[1])
        same = torch.equal(int8_linear(probe, 128, rebuilt, torch.float32),
                           int8_linear(probe, 128, packed, torch.float32))
    except (AttributeError, RuntimeError, OSError, NotImplementedError, TypeError) as error:
        log.info("packed int8 weights are not saved here (their levels are): %s", _first_line(error))
        return None
    if not same:
        log.info("packed int8 weights are not saved here (their levels are): rebuilt, they compute otherwise")
        return None
    # Everything oneDNN could choose a layout by: a weight rebuilt in another layout computes garbage, silently.
    machine = sorted(torch._C._cpu._get_cpu_capability().items()) if hasattr(torch._C, "_cpu") else []
    described = f"{torch.__version__}|{machine}|{layout.tolist()}"
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def _kernel_fails(layer_class: Any, tolerance: float) -> str | None:
    """A 128→64 layer of its own (bf16 inputs, as the model's) through `layer_class`, against `F.linear` over the
    weights it de-quantizes to: the largest difference within `tolerance` of the largest output."""
    generator = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(128, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(64, 128, generator=generator) * 0.05)
        linear.bias.copy_(torch.randn(64, generator=generator) * 0.01)
    probe = torch.randn(5, 128, generator=generator).to(torch.bfloat16)
    try:
        with torch.inference_mode():
            layer = layer_class(linear)
            got = layer(probe).float()
            expected = torch.nn.functional.linear(probe.float(), layer_class.rounded(linear.weight), linear.bias.float())
    except (AttributeError, RuntimeError, NotImplementedError) as error:  # ops gone, or not built for this CPU
        return f"{type(error).__name__}: {_first_line(error)}"
    difference = float((got - expected).abs().max() / expected.abs().max())
    return None if difference <= tolerance else f"its outputs differ from F.linear's by {difference:.3g}"


def cache_mismatch(model: Any) -> str | None:
    """Why the engine's batch cache cannot stand in for transformers' own, or None: a tiny batch (`_probe_batch`)
    through the model's forward over a batch cache (kv_cache.py) and over transformers' `DynamicCache` must give
    the same scores, within rounding (`STEP_TOLERANCE`), and the same keys and values in the first layer, bit for
    bit. Run on a model whose products are floating point (before int8 quantizing, whose batch-wide activation
    scales would turn the last bit of a difference into a large one)."""
    return _reason_if_raises(_compare_caches, model)


def pass_mismatch(model: Any) -> str | None:
    """Why the decode pass (forward_pass.py) cannot stand in for the model's forward, or None: where it takes
    a step of this model, its scores over a batch cache must be those of the model's forward, bit for bit."""
    return _reason_if_raises(_compare_passes, model)


def fall_back(model: Any, reason: str) -> None:
    """Put `model` on transformers' own attention, forward and cache, and say why in one log line."""
    from agent.llm.engine.attention import NAME
    from agent.llm.engine.kv_cache import KV_DTYPE

    setattr(model, PLAIN, reason)
    if hasattr(model, KV_DTYPE):
        delattr(model, KV_DTYPE)
    if attention_implementation(model) == NAME:
        use_attention(model, "sdpa")
    log.warning("the engine's fast path is off, running on transformers' own forward and cache: %s", reason)


def _reason_if_raises(check: Callable[[Any], str | None], model: Any) -> str | None:
    try:
        return check(model)
    except Exception as error:  # an internal that changed shape or signature: the reason, not a crash
        return f"{check.__name__.strip('_')}: {type(error).__name__}: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def _compare_caches(model: Any) -> str | None:
    from transformers import DynamicCache

    from agent.llm.engine.kv_cache import batch_cache

    ids, mask, steps = _probe_batch(model)
    kept = _keep_kv_dtype(model)
    try:
        roomy = batch_cache(model, [], 0, ids.shape[1], sum(step.shape[1] for step in steps))
        engine = _run_probe(model, roomy, ids, mask, steps)
        plain = DynamicCache(config=model.config)
        reference = _run_probe(model, plain, ids, mask, steps)
    finally:
        _keep_kv_dtype(model, kept)
    difference = max(float((mine - theirs).abs().max() / theirs.abs().max()) for mine, theirs in zip(engine, reference))
    log.debug("the engine's cache check: scores within %.2g of transformers' cache's (relative)", difference)
    if not difference <= STEP_TOLERANCE:  # NaN compares false too
        return "the model's forward over the engine's batch cache does not give its scores over DynamicCache"
    if not (torch.equal(roomy.layers[0].keys, plain.layers[0].keys)
            and torch.equal(roomy.layers[0].values, plain.layers[0].values)):
        return "the engine's batch cache does not hold the first layer's keys and values as DynamicCache does"
    return None


def _compare_passes(model: Any) -> str | None:
    from agent.llm.engine import forward_pass
    from agent.llm.engine.kv_cache import batch_cache

    ids, mask, steps = _probe_batch(model)
    new_tokens = sum(step.shape[1] for step in steps)
    ours, theirs = (batch_cache(model, [], 0, ids.shape[1], new_tokens) for _ in range(2))
    if not forward_pass.fits(model, ours, steps[0].shape[1]):
        return None  # the model's forward takes every step: nothing to compare
    mine = _run_probe(model, ours, ids, mask, steps, own_pass=True)
    expected = _run_probe(model, theirs, ids, mask, steps)
    if not all(torch.equal(a, b) for a, b in zip(mine, expected)):
        return "the decode pass (forward_pass.py) does not give the model's forward's scores"
    return None


def _keep_kv_dtype(model: Any, kept: Any = None) -> Any:
    """Take the batch caches' own KV dtype off `model` (returned), or put `kept` back: the caches are compared in
    the model's dtype (their own is a plain copy into a narrower tensor)."""
    from agent.llm.engine.kv_cache import KV_DTYPE

    if kept is not None:
        setattr(model, KV_DTYPE, kept)
        return None
    kept = getattr(model, KV_DTYPE, None)
    if kept is not None:
        delattr(model, KV_DTYPE)
    return kept


def _run_probe(model: Any, cache: Any, ids: torch.Tensor, mask: torch.Tensor, steps: list[torch.Tensor],
               own_pass: bool = False) -> list[torch.Tensor]:
    """The prompt's last scores and each step's, through the model's forward (or the decode pass for the steps)."""
    from agent.llm.engine import forward_pass
    from agent.llm.engine.decode_loop import cache_argument

    through = cache_argument(model)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.inference_mode():
        scores = [model(input_ids=ids, attention_mask=mask, position_ids=positions, **{through: cache},
                        use_cache=True, logits_to_keep=1).logits.float()]
        following = positions[:, -1:] + 1
        for step in steps:
            mask = torch.cat([mask, torch.ones_like(step)], dim=1)
            columns = following + torch.arange(step.shape[1], device=step.device)
            if own_pass:
                scores.append(forward_pass.decode_pass(model, step, mask, columns, cache, step.shape[1]))
            else:
                scores.append(model(input_ids=step, attention_mask=mask, position_ids=columns, **{through: cache},
                                    use_cache=True, logits_to_keep=step.shape[1]).logits.float())
            following = following + step.shape[1]
    return scores


def _probe_batch(model: Any) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Two rows of 20 prompt tokens (past a decode step's width, so the prompt path runs too), the second with
    three columns of padding, and two steps of two tokens a row: fixed token ids, on the model's device."""
    device = model.device
    vocabulary = min(model.config.vocab_size, 1000)
    tokens = torch.randint(1, vocabulary, (2, 24), generator=torch.Generator().manual_seed(0)).to(device)
    mask = torch.ones(2, 20, dtype=torch.long, device=device)
    mask[1, :3] = 0
    return tokens[:, :20], mask, [tokens[:, 20:22], tokens[:, 22:24]]
