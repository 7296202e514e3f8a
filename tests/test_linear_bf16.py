"""bf16 linear layers with their weights laid out once (engine/linear_bf16.py): the same outputs, bit for bit."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agent.llm.engine.linear_bf16 import PackedLinear, pack_linears, packing_available

# The packed kernel needs bf16 support in oneDNN (avx512bw/vl/dq or avx_ne_convert); on other CPUs (AVX2 only)
# `pack_linears` must leave every layer as it is, and the model must generate what it did.
CAN_PACK = packing_available()
PACKED = 2 * 7 + 1 if CAN_PACK else 0  # q, k, v, o, gate, up, down per layer, and the output layer


@pytest.mark.skipif(not CAN_PACK, reason="this CPU has no bf16 oneDNN kernel: nothing is packed (tests below)")
def test_a_packed_layer_computes_what_the_linear_layer_computes() -> None:
    torch.manual_seed(1)
    linear = torch.nn.Linear(96, 40, bias=True, dtype=torch.bfloat16)
    for shape in ((1, 1, 96), (3, 7, 96), (200, 96)):  # a decode step, a speculative check, a prompt
        inputs = torch.randn(*shape, dtype=torch.bfloat16)
        with torch.inference_mode():
            assert torch.equal(PackedLinear(linear)(inputs), linear(inputs))


def bf16_model(tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=tied)
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def greedy(model: LlamaForCausalLM) -> tuple[list[int], torch.Tensor]:
    ids = torch.tensor([[5, 9, 11, 3, 7]])
    with torch.inference_mode():
        output = model.generate(input_ids=ids, max_new_tokens=10, do_sample=False, pad_token_id=0,
                                return_dict_in_generate=True, output_logits=True)
    return output.sequences[0, 5:].tolist(), torch.stack(output.logits)


def test_a_packed_model_generates_the_same_tokens_from_the_same_scores() -> None:
    model = bf16_model(tied=False)
    tokens, logits = greedy(model)
    assert pack_linears(model) == PACKED
    assert isinstance(model.model.layers[0].mlp.up_proj, PackedLinear) == CAN_PACK
    packed_tokens, packed_logits = greedy(model)
    assert packed_tokens == tokens and torch.equal(packed_logits, logits)


def test_a_tied_output_layer_is_packed_as_a_copy_and_the_embedding_still_reads_its_weight() -> None:
    model = bf16_model(tied=True)
    tokens, logits = greedy(model)
    embedding = model.model.embed_tokens.weight.clone()
    assert pack_linears(model) == PACKED
    assert isinstance(model.lm_head, PackedLinear) == CAN_PACK
    packed_tokens, packed_logits = greedy(model)
    assert packed_tokens == tokens and torch.equal(packed_logits, logits)
    assert torch.equal(model.model.embed_tokens.weight, embedding)


def test_fp32_layers_are_left_alone() -> None:
    model = bf16_model(tied=False).float()
    assert pack_linears(model) == 0
