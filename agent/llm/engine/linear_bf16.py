"""Linear layers for bf16 on a CPU with their weights laid out once for oneDNN, not at every call.

PyTorch computes a bf16 `nn.Linear` on a CPU with oneDNN, which first reorders the weight into its blocked layout: a
copy of the whole weight at every call. For the few rows of a decode step that copy is most of the work (bench/README.md
§ Engine design measurements). The outputs are bit-for-bit the same. `pack_linears` makes that reorder once, at load,
the way PyTorch's own compiler does for frozen CPU models (`torch.ops.mkldnn._reorder_linear_weight`, then
`_linear_pointwise` per call).

Only bf16: for fp32 the packed kernel is sometimes slower and rounds differently, and MODEL_DTYPE=float32 promises
exact outputs; on a CPU without bf16 (where auto is fp32) it was faster in products timed alone, but not in
whole generations, whose passes wait on memory, and it holds more memory (see bench/README.md).

A tied output layer (the embedding's weight) is packed too, as a copy of its own: vocabulary × hidden size in bf16
more memory, for the largest product of a decode step.
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
