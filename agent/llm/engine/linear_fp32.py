"""fp32 linear layers on a CPU computing a decode step's few tokens as `weight @ inputsᵀ`.

`nn.Linear` computes `inputs @ weightᵀ`. For the 1-8 tokens of a decode step, MKL (the BLAS PyTorch's CPU wheels
use) runs that slowly on the CPUs we tried (a single token as a matrix-vector product, on one core), so a step
checking speculative tokens (speculative.py) cost up to twice a plain one. The same products as `weight @ inputsᵀ`,
which MKL streams over the weight's rows on every core, are faster; a single token is fed twice for it. From 12
tokens on (prompts) the two forms are within noise of each other, or `nn.Linear` wins, so longer inputs keep it
(bench/README.md § Engine design measurements).

Each output is the same dot product in another summation order: within fp32 rounding of `nn.Linear`'s, as
`nn.Linear`'s own outputs already differ in their last bits with the number of rows (MKL picks kernels by shape).
The weight is the layer's own parameter, so a tied output layer stays tied and nothing is copied.
"""

from __future__ import annotations

from typing import Any

import torch

# Products of at most this many tokens (a decode step's: rows x (1 + speculative tokens)) take `weight @ inputsᵀ`.
SHORT_INPUT_TOKENS = 8


class ShortInputLinear(torch.nn.Module):
    """`nn.Linear`'s forward (fp32, CPU), with a short input's product computed as `weight @ inputsᵀ`."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        flat = inputs.reshape(-1, self.in_features)
        tokens = flat.shape[0]
        if tokens > SHORT_INPUT_TOKENS:
            return torch.nn.functional.linear(inputs, self.weight, self.bias)
        if tokens == 1:  # one column would be a matrix-vector product, which MKL computes on one core
            flat = torch.cat([flat, flat])
        output = (self.weight @ flat.T).T[:tokens]
        if self.bias is not None:
            output = output + self.bias
        return output.contiguous().reshape(*inputs.shape[:-1], self.out_features)


def use_short_input_linears(model: Any) -> int:
    """Replace every fp32 `nn.Linear` of `model` on the CPU by a `ShortInputLinear`; returns how many."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32 \
                    and child.weight.device.type == "cpu":
                setattr(parent, name, ShortInputLinear(child))
                count += 1
    return count
