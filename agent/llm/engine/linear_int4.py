"""int4 linear layers on a CPU (MODEL_DTYPE=int4): the weights in 4 bits, as a 4-bit GGUF holds them.

Each group of 32 inputs of an output has its own scale and zero (`(level - 8) * scale + zero`, levels 0..15): the
shape of GGUF's Q4_0, Q4_1 and Q4_K blocks (32 weights, a scale, a minimum), so a model converted from such a file
comes back to nearly the levels it had. The product is torch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`,
through internals.py, checked once at load: `int4_fails`), on bf16 inputs; each row is computed on its own, so a
row's outputs do not depend on its batch neighbours. 0.625 bytes a weight, scales and zeros included (under a
third of bf16's; GGUF's Q4_K takes 0.5625).

Faster than bf16 for one chat, slower than int8 once a step holds more than a few tokens: the kernel reads the
weights again for every four rows (bench/README.md § MODEL_DTYPE=auto). The output layer, the largest product of a
step and the most sensitive to rounding, has int8 weights and unrounded inputs (`OutputInt8Linear`), as llama.cpp's
Q4_K_M keeps it in 6 bits.
Layers whose sizes the kernel cannot take (inputs not a multiple of 32, outputs not of 16) stay as loaded.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from agent.llm.engine.internals import int4_linear, int4_pack
from agent.llm.engine.linear_int8 import OutputInt8Linear, output_layer, quantize_linears

GROUP = 32  # inputs per scale and zero: GGUF's block
OUTPUT_MULTIPLE = 16  # the kernel's layout packs outputs in blocks of this many
# The self-test's bound (internals.py): bf16 inputs and bf16 scales round a little; a wrong layout gives ~1.
TOLERANCE = 0.02


def fits(linear: torch.nn.Linear) -> bool:
    """Whether the kernel takes a layer of this size."""
    return linear.in_features % GROUP == 0 and linear.out_features % OUTPUT_MULTIPLE == 0


def levels_scales_zeros(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`weight` [out, in] as levels (int32, 0..15, [out, in]) and each group's scale and zero ([out, in / GROUP],
    float32): the group's minimum to its maximum in 15 steps."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // GROUP, GROUP)
    low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
    scales = ((high - low) / 15).clamp(min=1e-8)
    levels = ((groups - low) / scales).round().clamp(0, 15).to(torch.int32).reshape(out_features, in_features)
    return levels, scales.squeeze(-1), (low + 8 * scales).squeeze(-1)


class Int4Linear(torch.nn.Module):
    """`nn.Linear`'s forward with its weight in int4 groups; inputs and outputs in the model's dtype (the product
    itself takes bf16)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype = linear.weight.dtype
        levels, scales, zeros = levels_scales_zeros(linear.weight)
        self.register_buffer("packed", int4_pack(levels))
        self.register_buffer("scales_and_zeros", torch.stack([scales.t(), zeros.t()], dim=-1)
                             .to(torch.bfloat16).contiguous())
        self.bias = linear.bias
        self.nbytes = self.packed.nbytes + self.scales_and_zeros.nbytes

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        flat = inputs.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        output = int4_linear(flat, self.packed, GROUP, self.scales_and_zeros).to(self.out_dtype)
        if self.bias is not None:
            output = output + self.bias
        return output.reshape(*inputs.shape[:-1], self.out_features)

    @staticmethod
    def rounded(weight: torch.Tensor) -> torch.Tensor:
        """The float32 weight this layer computes with, for `weight` (scales and zeros rounded to bf16, as held)."""
        levels, scales, zeros = levels_scales_zeros(weight)
        scales, zeros = (part.to(torch.bfloat16).float().unsqueeze(-1) for part in (scales, zeros))
        grouped = levels.reshape(*scales.shape[:2], GROUP).float()
        return ((grouped - 8) * scales + zeros).reshape(weight.shape)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 groups of {GROUP}"


def quantize_int4(model: Any, output_in_int8: bool = True, between: Callable[[], Any] | None = None) -> Any:
    """The model with its linear layers in int4 (MODEL_DTYPE=int4), replaced in place; the output layer in int8
    weights (`output_in_int8`, where that kernel runs); returns the model."""
    output = output_layer(model)

    def make(linear: torch.nn.Linear, name: str) -> torch.nn.Module | None:
        if linear is output and output_in_int8:
            return OutputInt8Linear(linear)
        return Int4Linear(linear) if fits(linear) else None

    quantize_linears(model, make, between)
    return model
