"""int8 linear layers on a CPU (MODEL_DTYPE=int8, and what `auto` picks on CPUs with VNNI or AMX from the
0.5B size up): weights per output channel, activations quantized at every product, per row.

On a CPU decoding reads every weight once per token, so int8 weights (half of bf16's bytes, a quarter of fp32's)
make a step faster, and with VNNI the integer products are faster than bf16's too, prompts included. Each row
(token) of a product's input is rounded to 8 bits on a scale of its own, its largest magnitude: finer than one
scale for the batch, and a row's outputs never depend on its batch neighbours (the integer sums are exact). Where
the CPU has no VNNI the activations keep 7 bits (internals.int8_activation_bits).

The product is oneDNN's (`torch.ops.onednn.qlinear_*`, what PyTorch's own compiler emits for int8 models on x86),
its weight laid out once, one byte a weight: laying out takes oneDNN 30 ms for a 15M-weight product on 2 cores
(4.3 s of a 1.5B model's start), so the first start saves the laid-out bytes (saved_int8.py) and later ones build
the packed weights over a mapping of them, as AOTInductor does with the weights it compiles in. The activations
are quantized here, not by the kernel, since oneDNN takes one scale per tensor. It replaced fbgemm's dynamic
product, which torch reaches only through the deprecated quantized tensors and which scaled the whole batch as one
(each row had to be divided by its own largest magnitude first, with a range row below them): at the 0.5B and 1.5B
shapes oneDNN's is the faster (bench/README.md § Linear layers and § Side by side after issue 37's third round).
Both hold one byte a weight. The kernel is reached through internals.py, which checks it once at load
(`int8_fails`); where it is gone the layers stay as loaded, with one log line.

`quantize_linears` replaces the layers one at a time, so the float weights of one layer at most are held twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from agent.llm.engine.internals import (int8_activation_bits, int8_linear, int8_pack, int8_packed_bytes,
                                        int8_packed_from_bytes, int8_weight_only_linear)

if TYPE_CHECKING:
    from agent.llm.engine.saved_int8 import SavedLevels

Levels = tuple[torch.Tensor, torch.Tensor]  # a weight's int8 levels [out, in] and float32 scale per output


@dataclass(frozen=True)
class PackedBytes:
    """An int8 weight as oneDNN laid it out, saved (saved_int8.py): its bytes (at a later start, a mapping of the
    saved file), their layout (oneDNN's memory descriptor) and the float32 scale per output."""

    raw: torch.Tensor
    layout: torch.Tensor
    scales: torch.Tensor

# The self-test's bound (internals.py): the product's largest difference from `F.linear` over the de-quantized
# weight, as a share of the largest output. Seven-bit activations give about 0.02; a wrong layout gives ~1.
TOLERANCE = 0.05
OUTPUT_TOLERANCE = 0.02  # the output layer's product: bf16 inputs, bf16 scales


# Rows one product takes at once: a prompt's rows in blocks keep each block's float32 copy, its uint8 activations
# and its output in the CPU's cache. At the 0.5B shape's MLP (two products), 989 rows took 82 ms against 94-102 at
# once, 2,000 rows 162 against 195-241 (bench/README.md § Linear layers).
ROW_BLOCK = 256


class Int8Linear(torch.nn.Module):
    """`nn.Linear`'s forward with its weight in int8 (packed for oneDNN); inputs and outputs in the model's dtype."""

    def __init__(self, linear: torch.nn.Linear, weight: Levels | PackedBytes | None = None):
        """`weight`: `per_channel_int8` of the weight computed before, or the bytes they were packed into (both
        from saved_int8.py; then `linear` may be on the meta device, its shape and bias all that is read); else the
        levels are computed here."""
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.out_dtype = linear.weight.dtype
        if isinstance(weight, PackedBytes):  # no packing: the packed weight is built over the saved bytes
            self.packed = int8_packed_from_bytes(weight.raw, weight.layout, weight.scales, self.in_features)
            self.packed_memory: torch.Tensor | None = weight.raw  # the bytes it computes with: held while it is
        else:
            self.packed = int8_pack(*(weight or per_channel_int8(linear.weight)))  # oneDNN's opaque tensor
            self.packed_memory = None
        self.bias = linear.bias  # added after the rows are scaled back (see forward)
        self.levels = (1 << (int8_activation_bits() - 1)) - 1  # 127, or 63 where 8 bits would overflow
        self.nbytes = linear.out_features * (linear.in_features + 4)  # the int8 weight and its scales

    def packed_bytes(self) -> PackedBytes:
        """The packed weight as saved_int8.py saves it (its bytes a view of this layer's memory)."""
        raw, layout = int8_packed_bytes(self.packed)
        return PackedBytes(raw, layout, self.packed[1])

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        flat = inputs.reshape(-1, self.in_features)
        if flat.shape[0] <= ROW_BLOCK:
            output = self._rows(flat)
        else:  # a prompt: its rows a block at a time (each row is computed on its own, so the result is the same)
            output = flat.new_empty((flat.shape[0], self.out_features), dtype=self.out_dtype)
            for start in range(0, flat.shape[0], ROW_BLOCK):
                output[start:start + ROW_BLOCK] = self._rows(flat[start:start + ROW_BLOCK])
        return output.reshape(*inputs.shape[:-1], self.out_features)

    def _rows(self, flat: torch.Tensor) -> torch.Tensor:
        # Each row on a scale of its own (its largest magnitude at the top level), shifted to uint8 around a zero
        # point; the product's integer sums are exact, so its outputs are scaled back per row (the bias after).
        flat = flat.to(torch.float32, copy=True)  # its own: rounded in place
        scales = row_scales(flat).div_(self.levels)
        activations = flat.div_(scales).round_().add_(self.levels + 1).to(torch.uint8)
        output = int8_linear(activations, self.levels + 1, self.packed, self.out_dtype).mul_(scales.to(self.out_dtype))
        return output.add_(self.bias) if self.bias is not None else output

    @staticmethod
    def rounded(weight: torch.Tensor) -> torch.Tensor:
        """The float32 weight this layer computes with, for `weight` (what the self-test compares against)."""
        weight = weight.detach().float()
        scales = (weight.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
        return (weight / scales).round().clamp(-128, 127) * scales

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class OutputInt8Linear(torch.nn.Module):
    """The output layer with its weight in int8 per output channel and its inputs as they are (bf16 or fp32): the
    scores decide every token, and a small model's top two are often close, so its inputs are not rounded to the
    seven bits of `Int8Linear`'s (which turned greedy answers of the test model); each row computed on its own."""

    def __init__(self, linear: torch.nn.Linear, levels: Levels | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        levels, scales = levels or per_channel_int8(linear.weight)
        self.register_buffer("weight_int8", levels)
        self.register_buffer("scales", scales.to(linear.weight.dtype))
        self.bias = linear.bias
        self.nbytes = self.weight_int8.nbytes + self.scales.nbytes

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        flat = inputs.reshape(-1, self.in_features).to(self.scales.dtype).contiguous()
        output = int8_weight_only_linear(flat, self.weight_int8, self.scales)
        if self.bias is not None:
            output = output + self.bias
        return output.reshape(*inputs.shape[:-1], self.out_features)

    @staticmethod
    def rounded(weight: torch.Tensor) -> torch.Tensor:
        """The float32 weight this layer computes with (scales rounded to the model's dtype, as held)."""
        held = weight.dtype
        weight = weight.detach().float()
        scales = (weight.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
        return (weight / scales).round().clamp(-128, 127) * scales.to(held).float()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


def per_channel_int8(weight: torch.Tensor, rows: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """`weight` [out, in] as int8 levels, symmetric per output (row), and each row's float32 scale: `rounded`'s
    levels. Computed `rows` rows at a time in float32, which stay in the CPU's cache: ten times faster at the 1.5B
    shape than the whole weight at once (a second start of it spent 5 of its 14 s there)."""
    levels = torch.empty(weight.shape, dtype=torch.int8)
    scales = torch.empty(weight.shape[0])
    for start in range(0, weight.shape[0], rows):
        block = weight[start:start + rows].detach().float()
        block_scales = block.abs().amax(dim=1, keepdim=True).div_(127).clamp_(min=1e-12)
        levels[start:start + rows] = block.div_(block_scales).round_().clamp_(-128, 127)  # whole numbers: exact
        scales[start:start + rows] = block_scales.squeeze(1)
    return levels, scales


def row_scales(flat: torch.Tensor) -> torch.Tensor:
    """Each row's largest magnitude ([rows, 1]; at least the smallest normal float, so that a row of zeros stays
    zeros). abs-then-amax on float32: torch's infinity-norm took 4-14 times as long on bf16 rows."""
    return flat.abs().amax(dim=1, keepdim=True).clamp_min_(torch.finfo(flat.dtype).tiny)


def output_layer(model: Any) -> torch.nn.Module | None:
    """The model's output layer (the scores' product), or None."""
    return model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None


def quantize_int8(model: Any, output_weight_only: bool = True, between: Callable[[], Any] | None = None,
                  saved: SavedLevels | None = None) -> Any:
    """The model with its linear layers in int8 (MODEL_DTYPE=int8), replaced in place; the output layer's inputs
    left unrounded (`OutputInt8Linear`) where `output_weight_only`; returns the model. With `saved`, each layer's
    levels are read from there, or computed and saved there (saved_int8.py)."""
    output = output_layer(model)

    def make(linear: torch.nn.Linear, name: str) -> torch.nn.Module:
        weight_only = linear is output and output_weight_only
        found = saved.get(name, linear.out_features, linear.in_features) if saved is not None else None
        if weight_only and isinstance(found, PackedBytes):  # not saved so: the weight-only product saves levels
            found = None
        levels = per_channel_int8(linear.weight) if found is None else None
        layer = (OutputInt8Linear if weight_only else Int8Linear)(linear, found or levels)
        if levels is not None and saved is not None:
            saved.put(name, levels, layer.packed_bytes() if isinstance(layer, Int8Linear) else None)
        return layer

    quantize_linears(model, make, between)
    if saved is not None:
        saved.finish()
    return model


def quantize_linears(model: Any, make: Callable[[torch.nn.Linear, str], torch.nn.Module | None],
                     between: Callable[[], Any] | None = None) -> int:
    """Replace every float `nn.Linear` of `model` on the CPU by `make(layer, its name)` (None: keep it), one at a
    time, so that a layer's float weight is let go before the next is quantized; returns how many were replaced. A tied
    output layer gets a quantized copy; the embedding keeps its weight. `between` is called after each (loading
    hands back the float weight's memory there: load_leftovers.py)."""
    count = 0
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child.weight.device.type != "cpu":
                continue
            with torch.no_grad():
                replacement = make(child, f"{parent_name}.{name}" if parent_name else name)
            if replacement is not None:
                setattr(parent, name, replacement)
                count += 1
                if between is not None:
                    between()
    return count
