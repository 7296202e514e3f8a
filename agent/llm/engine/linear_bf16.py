"""Linear layers for bf16 on a CPU with their weights laid out once for oneDNN, not at every call.

PyTorch computes a bf16 `nn.Linear` on a CPU with oneDNN, which first reorders the weight into its blocked layout: a
copy of the whole weight at every call. For the few rows of a decode step that copy is most of the work (bench/README.md
§ Engine design measurements). The outputs are bit-for-bit the same. `pack_linears` makes that reorder once, at load,
the way PyTorch's own compiler does for frozen CPU models (through oneDNN's private ops: internals.py), where its
check on the model's own first layer holds (the packed product equals `F.linear`).

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

from agent.llm.engine.internals import pack_bf16_weight, packed_bf16_linear, packing_fails

log = logging.getLogger(__name__)


class PackedLinear(torch.nn.Module):
    """`nn.Linear`'s forward, its weight held in oneDNN's layout (bf16, CPU)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed_weight", pack_bf16_weight(linear.weight))
        self.bias = linear.bias

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        flat = inputs.reshape(-1, self.in_features).contiguous()
        output = packed_bf16_linear(flat, self.packed_weight, self.bias)
        return output.reshape(*inputs.shape[:-1], self.out_features)


def pack_linears(model: Any) -> int:
    """Replace every bf16 `nn.Linear` of `model` (on the CPU) by a `PackedLinear`; returns how many. Nothing
    changes where this PyTorch has no such kernel, or it does not give the first layer's `F.linear` (one log line)."""
    found = [(parent, name, child) for parent in list(model.modules()) for name, child in list(parent.named_children())
             if type(child) is torch.nn.Linear and child.weight.dtype == torch.bfloat16
             and child.weight.device.type == "cpu"]
    failure = packing_fails(found[0][2]) if found else None
    if failure is not None:
        log.info("bf16 linear layers stay as they are: %s", failure)
        return 0
    for parent, name, child in found:
        setattr(parent, name, PackedLinear(child))
    return len(found)


def packing_available() -> bool:
    """Whether the packed kernel runs here and gives what `nn.Linear` gives (on a small layer of its own)."""
    return packing_fails(torch.nn.Linear(32, 16, dtype=torch.bfloat16)) is None
