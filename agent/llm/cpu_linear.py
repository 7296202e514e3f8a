"""Linear layers on a CPU with their weights laid out once for oneDNN, not at every call: bf16, and fp32 where the
CPU has no bf16.

PyTorch computes a bf16 `nn.Linear` on a CPU with oneDNN, which first reorders the weight into its blocked layout:
a copy of the whole weight at every call. For the few rows of a decode step that copy is most of the work.
Measured on a 2-core AVX-512 CPU (SmolLM2-135M's shapes, bf16): 576→1536 at 1 row 71 µs plain against 33 µs with
the weight reordered once, at 8 rows 85 against 53, at 200 rows (a prompt) 896 against 832; the outputs are
bit-for-bit the same. `pack_linears` makes that reorder once, at load, the way PyTorch's own compiler does for
frozen CPU models (`torch.ops.mkldnn._reorder_linear_weight`, then `_linear_pointwise` per call).

fp32 goes through MKL, which packs the weight at every call too, for a product of more than one row. On a 2-core
AVX2 CPU without bf16 (where MODEL_DTYPE=auto is fp32) oneDNN's packed fp32 kernel was never slower: 576→1536 at
1 row 0.13 ms either way, at 8 rows 0.36 plain against 0.18 packed, the output layer (576→49,152) at 1 row 15.7
against 8.1 and at 8 rows 32.9 against 12.1, a 140-token prompt's whole pass 664 ms against 455. Its sums run in
another order, so the scores differ from MKL's in the last bits (1e-4 of logits around 20), and each row's are the
same whatever the batch, which MKL's are not (1 row against 2 or more). On CPUs with bf16, fp32 (then the
explicit MODEL_DTYPE=float32) stays on MKL: the packed kernel measured sometimes slower there.

A tied output layer (the embedding's weight) is packed too, as a copy of its own: vocabulary × hidden size more
memory (bf16: 56 MB for SmolLM2-135M, 272 MB for Qwen2.5-0.5B; fp32 twice that), for the largest product of a
decode step (bf16, 49,152×576 at 8 rows: 4.9 ms plain against 2.3 ms packed; 5-10% of a whole pass).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


class PackedLinear(torch.nn.Module):
    """`nn.Linear`'s forward, its weight held in oneDNN's layout (bf16 or fp32, CPU)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().contiguous(), 1)
        self.register_buffer("packed_weight", packed)
        self.bias = linear.bias

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        flat = inputs.reshape(-1, self.in_features).contiguous()
        output = torch.ops.mkldnn._linear_pointwise(flat, self.packed_weight, self.bias, "none", [], "")
        return output.reshape(*inputs.shape[:-1], self.out_features)


def pack_linears(model: Any, dtype: torch.dtype = torch.bfloat16) -> int:
    """Replace every `nn.Linear` of `model` in `dtype` (on the CPU) by a `PackedLinear`; returns how many. Nothing
    changes where this PyTorch has no such kernel."""
    if not packing_available(dtype):
        return 0
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype == dtype and child.weight.device.type == "cpu":
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count


def packing_available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether the packed kernel runs here for `dtype` and gives what `nn.Linear` gives: in bf16 bit for bit, in
    fp32 to its rounding (the sums run in another order)."""
    try:
        linear = torch.nn.Linear(32, 16, dtype=dtype)
        probe = torch.randn(2, 32, dtype=dtype)
        with torch.inference_mode():
            packed, plain = PackedLinear(linear)(probe), linear(probe)
        return bool(torch.equal(packed, plain) if dtype == torch.bfloat16 else torch.allclose(packed, plain))
    except (AttributeError, RuntimeError) as error:  # no mkldnn ops in this build, or no support for dtype in them
        log.info("%s linear layers stay as they are: %s", dtype, error)
        return False
