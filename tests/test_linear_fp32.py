"""fp32 linear layers computing a decode step's few tokens as `weight @ inputsᵀ` (agent/llm/engine/linear_fp32.py)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agent.llm.engine.linear_fp32 import SHORT_INPUT_TOKENS, ShortInputLinear, use_short_input_linears


def test_a_short_input_layer_computes_what_the_linear_layer_computes_within_fp32_rounding() -> None:
    torch.manual_seed(1)
    linear = torch.nn.Linear(96, 40, bias=True)
    short = ShortInputLinear(linear)
    # one token (fed twice inside), a speculative check, a full decode step, the first prompt length past the bound
    for shape in ((1, 1, 96), (1, 3, 96), (SHORT_INPUT_TOKENS, 1, 96), (3, 3, 96), (200, 96)):
        inputs = torch.randn(*shape)
        with torch.inference_mode():
            ours, theirs = short(inputs), linear(inputs)
        assert ours.shape == theirs.shape and ours.is_contiguous()
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_a_layer_without_bias_and_a_long_input_give_what_the_linear_layer_gives_exactly() -> None:
    torch.manual_seed(2)
    linear = torch.nn.Linear(64, 32, bias=False)
    inputs = torch.randn(2, SHORT_INPUT_TOKENS + 1, 64)  # a prompt: nn.Linear's own product, bit for bit
    with torch.inference_mode():
        assert torch.equal(ShortInputLinear(linear)(inputs), linear(inputs))
        short = ShortInputLinear(linear)(inputs[:1, :2])
    torch.testing.assert_close(short, linear(inputs[:1, :2]), rtol=1e-5, atol=1e-5)


def fp32_model(tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=tied)
    return LlamaForCausalLM(config).eval()


def greedy(model: LlamaForCausalLM) -> tuple[list[int], torch.Tensor]:
    ids = torch.tensor([[5, 9, 11, 3, 7]])
    with torch.inference_mode():
        output = model.generate(input_ids=ids, max_new_tokens=10, do_sample=False, pad_token_id=0,
                                return_dict_in_generate=True, output_logits=True)
    return output.sequences[0, 5:].tolist(), torch.stack(output.logits)


def test_a_model_with_short_input_layers_generates_the_same_tokens_and_keeps_its_output_layer_tied() -> None:
    model = fp32_model(tied=True)
    tokens, logits = greedy(model)
    assert use_short_input_linears(model) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the output
    assert isinstance(model.lm_head, ShortInputLinear)
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still one tensor: nothing copied
    short_tokens, short_logits = greedy(model)
    assert short_tokens == tokens
    torch.testing.assert_close(short_logits, logits, rtol=1e-4, atol=1e-5)


def test_bf16_layers_are_left_alone() -> None:
    model = fp32_model(tied=False).to(torch.bfloat16)
    assert use_short_input_linears(model) == 0
    assert type(model.model.layers[0].mlp.up_proj) is torch.nn.Linear
