"""Stacked projections (agent/llm/engine/linear_fused.py): one product for a layer's query/key/value and gate/up, with
exactly the outputs, and so the tokens, of the separate ones."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from agent.llm.engine.linear_bf16 import pack_linears
from agent.llm.engine.linear_fused import ProjectionSlice, StackedProjections, fuse_projections
from agent.llm.engine.linear_int8 import Int8Linear, quantize_int8


def projections(bias: bool, dtype: torch.dtype) -> list[torch.nn.Linear]:
    torch.manual_seed(1)
    return [torch.nn.Linear(48, size, bias=bias, dtype=dtype) for size in (48, 16, 16)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_each_slice_of_the_stacked_product_is_its_projection_bit_for_bit(dtype: torch.dtype, bias: bool) -> None:
    linears = projections(bias, dtype)
    source = StackedProjections(linears)
    slices = [ProjectionSlice(source, 0, 48), ProjectionSlice(source, 48, 64), ProjectionSlice(source, 64, 80)]
    for rows in (1, 3, 40):
        inputs = torch.randn(rows, 2, 48, dtype=dtype)
        with torch.inference_mode():
            for linear, part in zip(linears, slices):
                assert torch.equal(part(inputs), linear(inputs))


def test_a_slice_given_another_input_computes_it_rather_than_reusing_the_last_product() -> None:
    linears = projections(True, torch.float32)
    source = StackedProjections(linears)
    query, key = ProjectionSlice(source, 0, 48), ProjectionSlice(source, 48, 64)
    first, second = torch.randn(1, 48), torch.randn(1, 48)
    with torch.inference_mode():
        query(first)
        assert torch.equal(key(second), linears[1](second))
        assert torch.equal(key(first.clone()), linears[1](first))  # equal values, another tensor: computed anew


def test_once_every_projection_took_its_columns_the_product_is_not_held() -> None:
    source = StackedProjections(projections(False, torch.float32))
    parts = [ProjectionSlice(source, 0, 48), ProjectionSlice(source, 48, 64), ProjectionSlice(source, 64, 80)]
    inputs = torch.randn(300, 48)
    with torch.inference_mode():
        parts[0](inputs)
        assert source._output is not None
        parts[1](inputs), parts[2](inputs)
    assert source._input is None and source._output is None


def tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    sizes = dict(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                 num_key_value_heads=2)
    if kind == "qwen2":  # biases on query, key and value, none on the MLP
        return Qwen2ForCausalLM(Qwen2Config(**sizes)).to(torch.bfloat16).eval()
    return LlamaForCausalLM(LlamaConfig(**sizes)).to(torch.bfloat16).eval()


def greedy(model: torch.nn.Module) -> tuple[list[list[int]], torch.Tensor]:
    ids = torch.tensor([[0, 0, 5, 9, 11, 3], [7, 1, 2, 8, 4, 6]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.inference_mode():
        output = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10, do_sample=False,
                                pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    return output.sequences[:, ids.shape[1]:].tolist(), torch.stack(output.logits)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_bf16_model_with_stacked_projections_gives_the_same_tokens_and_scores(kind: str) -> None:
    model = tiny(kind)
    pack_linears(model)
    tokens, logits = greedy(model)
    fused = tiny(kind)
    assert fuse_projections(fused) == 4  # two layers, each attention and MLP
    pack_linears(fused)
    attention = fused.model.layers[0].self_attn
    assert isinstance(attention.q_proj, ProjectionSlice) and not hasattr(attention.q_proj, "weight")
    fused_tokens, fused_logits = greedy(fused)
    assert fused_tokens == tokens and torch.equal(fused_logits, logits)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_an_int8_model_stacked_before_quantizing_gives_the_same_tokens_and_scores(kind: str) -> None:
    # One activation scale for the stacked product is the scale each projection computed of the same input, and
    # the weights are scaled per output channel, so stacking changes no output bit.
    tokens, logits = greedy(quantize_int8(tiny(kind).float()))
    fused = tiny(kind).float()
    assert fuse_projections(fused) == 4
    fused = quantize_int8(fused)
    stacked = fused.model.layers[0].self_attn.qkv_proj.stacked
    assert type(stacked) is Int8Linear and stacked.out_features == 48 + 2 * 16
    fused_tokens, fused_logits = greedy(fused)
    assert fused_tokens == tokens and torch.equal(fused_logits, logits)


def test_projections_of_different_inputs_or_kinds_are_left_as_they_are() -> None:
    module = torch.nn.Module()
    module.q_proj, module.k_proj, module.v_proj = (torch.nn.Linear(48, 48), torch.nn.Linear(32, 16),
                                                   torch.nn.Linear(48, 16))
    module.gate_proj = torch.nn.Linear(48, 96)  # no up_proj beside it
    assert fuse_projections(module) == 0
    assert type(module.q_proj) is torch.nn.Linear and type(module.gate_proj) is torch.nn.Linear
