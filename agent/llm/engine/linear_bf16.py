"""Linear layers for bf16 on a CPU with their weights laid out once for oneDNN, not at every call.

PyTorch computes a bf16 `nn.Linear` on a CPU with oneDNN, which first reorders the weight into its blocked layout:
a copy of the whole weight at every call. For the few rows of a decode step that copy is most of the work.
Measured on a 2-core AVX-512 CPU (SmolLM2-135M's shapes, bf16): 576→1536 at 1 row 71 µs plain against 33 µs with
the weight reordered once, at 8 rows 85 against 53, at 200 rows (a prompt) 896 against 832; the outputs are
bit-for-bit the same. `pack_linears` makes that reorder once, at load, the way PyTorch's own compiler does for
frozen CPU models (`torch.ops.mkldnn._reorder_linear_weight`, then `_linear_pointwise` per call).

Only bf16: for fp32 the packed kernel is sometimes slower and rounds differently, and MODEL_DTYPE=float32 promises
exact outputs. On a 2-core AVX2 CPU without bf16 (where auto is fp32) it was 2-4x faster than MKL in products
measured alone (weights in cache), but not in whole generations, whose passes wait on memory: interleaved on the
same recorded calls, 1 chat 106.6 s against 110.2, 8 chats 116.0 against 114.4, for ~500 MB more resident.

A tied output layer (the embedding's weight) is packed too, as a copy of its own: vocabulary × hidden size in bf16
more memory (56 MB for SmolLM2-135M, 272 MB for Qwen2.5-0.5B), for the largest product of a decode step
(49,152×576 at 8 rows: 4.9 ms plain against 2.3 ms packed; 5-10% of a whole pass).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


class PackedLinear(torch.nn.Module):
    """`nn.Linear`'s forward, its weight held in oneDNN's layout (bf16, CPU)."""

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


def pack_linears(model: Any) -> int:
    """Replace every bf16 `nn.Linear` of `model` (on the CPU) by a `PackedLinear`; returns how many. Nothing
    changes where this PyTorch has no such kernel."""
    if not packing_available():
        return 0
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype == torch.bfloat16 \
                    and child.weight.device.type == "cpu":
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count


def packing_available() -> bool:
    """Whether the packed kernel runs here and gives what `nn.Linear` gives."""
    try:
        linear = torch.nn.Linear(32, 16, dtype=torch.bfloat16)
        probe = torch.randn(2, 32, dtype=torch.bfloat16)
        with torch.inference_mode():
            return bool(torch.equal(PackedLinear(linear)(probe), linear(probe)))
    except (AttributeError, RuntimeError) as error:  # no mkldnn ops in this build, or no bf16 support in them
        log.info("bf16 linear layers stay as they are: %s", error)
        return False
