"""The projections a layer makes of one input, computed as one product: attention's query, key and value, and the
MLP's gate and up.

A decode step's products are small (1-8 rows), so in bf16 a projection costs much in its call, not its
arithmetic: one stacked product is faster than two or three. For int8 too, stacked before quantizing (weights.py):
each quantized product also scales its input first, once for the stack instead of once a projection. Not for fp32,
whose kernels gained nothing from it (its prompts were slower). See bench/README.md § Engine design
measurements.

transformers' layers call each projection in turn on the same hidden states, and their forward is theirs to keep.
So `fuse_projections` stacks the weights into one `nn.Linear` (registered on the layer, where `pack_linears`
finds it as any other), and leaves a `ProjectionSlice` in each projection's place: the first call computes the
stacked product, and each slice takes its own columns of it while its input is the very same tensor. Each output
column is the same dot product as before, bit for bit (tests/test_linear_fused.py), so the tokens do not change.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch

# Projections of one module that read the same input, in the order transformers' layers call them.
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
# Where the stacked layer is registered on the module, per group.
STACKED_NAMES = {"q_proj": "qkv_proj", "gate_proj": "gate_up_proj"}
# Builds a stack's layer from its shape (a meta `nn.Linear` holding the stacked bias), or None (stack the weights).
MakeStacked = Callable[[torch.nn.Linear], "torch.nn.Module | None"]


class StackedProjections(torch.nn.Module):
    """One linear layer computing several projections of the same input; keeps its last input and output until
    each projection's slice has taken its columns of that product."""

    def __init__(self, linears: Sequence[torch.nn.Linear], make: MakeStacked | None = None):
        """`make`: builds the layer computing the stack from its shape (an `nn.Linear` on the meta device with the
        stacked bias), instead of stacking the float weights: int8 weights saved at an earlier start
        (saved_int8.py). Where it gives None the float weights are stacked after all."""
        super().__init__()
        made = make(stacked_linear(linears, weights=False)) if make is not None else None
        self.stacked = made or stacked_linear(linears)
        self.parts = len(linears)
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._taken = 0

    def columns(self, inputs: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Columns `start:end` of the stacked product of `inputs`, computed when they are not the tensor the
        last call had. Identity, not equality: the layer hands every projection the same tensor object, and while
        it is held here no other tensor can take its place unseen. Once every part has taken its columns the
        product is let go (a prompt's would hold megabytes a layer)."""
        if inputs is not self._input:
            self._input, self._output, self._taken = inputs, self.stacked(inputs), 0
        output = self._output
        self._taken += 1
        if self._taken >= self.parts:
            self._input = self._output = None
        return output[..., start:end]  # type: ignore[index]


def stacked_linear(linears: Sequence[torch.nn.Linear], weights: bool = True) -> torch.nn.Linear:
    """One `nn.Linear` computing `linears`' outputs one after the other: their weights stacked (or, without
    `weights`, only the stack's shape: its weight on the meta device), their biases stacked (zeros for one without)."""
    first = linears[0]
    # Made on the meta device, then given the stack as its weight: nothing allocated or drawn at random for a
    # weight replaced at once (drawing was a fifth of a small model's start), and one copy of the weights, not two.
    stacked = torch.nn.Linear(first.in_features, sum(linear.out_features for linear in linears), bias=False,
                              device="meta", dtype=first.weight.dtype)
    with torch.no_grad():
        if weights:
            stacked.weight = torch.nn.Parameter(torch.cat([linear.weight for linear in linears]))
        if any(linear.bias is not None for linear in linears):
            stacked.bias = torch.nn.Parameter(torch.cat([linear.bias if linear.bias is not None else
                                                         linear.weight.new_zeros(linear.out_features)
                                                         for linear in linears]))
    return stacked


class ProjectionSlice(torch.nn.Module):
    """One projection's place in the model: its columns of the stacked product."""

    def __init__(self, source: StackedProjections, start: int, end: int):
        super().__init__()
        self._source = (source,)  # a tuple, so that the module is registered once, on the layer, not per slice
        self.start, self.end = start, end
        self.in_features, self.out_features = source.stacked.in_features, end - start

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self._source[0].columns(inputs, self.start, self.end)


def fuse_projections(model: Any, between: Callable[[], Any] | None = None,
                     make: Callable[[str, torch.nn.Linear], torch.nn.Module | None] | None = None) -> int:
    """Stack each module's query/key/value and gate/up projections (plain `nn.Linear`s of one input size and
    dtype) into one layer; returns how many stacks were made. `between` is called after each stack (loading hands
    back the unstacked weights' memory there: load_leftovers.py). `make(name, shape)`: the layer of stack `name` (as
    `named_modules` will call it), built from its shape where it can be (`StackedProjections`)."""
    count = 0
    for module_name, module in list(model.named_modules()):
        for names in GROUPS:
            linears = [getattr(module, name, None) for name in names]
            if not _stackable(linears):
                continue
            stack_name = f"{module_name}.{STACKED_NAMES[names[0]]}.stacked".lstrip(".")
            source = StackedProjections(linears, functools.partial(make, stack_name) if make else None)  # type: ignore
            setattr(module, STACKED_NAMES[names[0]], source)
            start = 0
            for name, linear in zip(names, linears):
                setattr(module, name, ProjectionSlice(source, start, start + linear.out_features))  # type: ignore
                start += linear.out_features  # type: ignore[union-attr]
            count += 1
            if between is not None:
                between()
    return count


def _stackable(linears: Sequence[Any]) -> bool:
    return (all(type(linear) is torch.nn.Linear for linear in linears)
            and len({(linear.in_features, linear.weight.dtype, linear.weight.device) for linear in linears}) == 1)
