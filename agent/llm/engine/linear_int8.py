"""int8 linear layers on a CPU: weights per output channel, activations quantized at every product.

On a CPU decoding reads every weight once per token, so int8 weights (a quarter of fp32's bytes) make a step
about twice as fast, and fbgemm's int8 kernels speed prompts up too (bench/README.md § Engine design
measurements). The price: outputs differ a
little from fp32's, and a step's activations are scaled over the whole batch, so a row's output may depend on
its batch neighbours. `torch.ao`'s dynamic quantization is deprecated in favour of torchao, but is in the
torch this project pins, with the CPU kernels torchao lacks without compiling.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch


def quantize_int8(model: Any) -> Any:
    """The model with its linear layers in int8 (MODEL_DTYPE=int8), quantized in place."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation notices, once per layer
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8,
                                inplace=True)  # no second copy of the weights, even for a moment
