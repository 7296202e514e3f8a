"""Quantized linear layers (engine/linear_int8.py, engine/linear_int4.py): what they compute, what they hold, how they
fall back, and the real model on int4 weights with batches, the prefix cache, a grammar and speculative tokens."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
import pytest_asyncio
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agent.conversations import ReactConversation, TurnRules
from agent.grammar import GrammarLimits
from agent.llm.base import ModelRequest
from agent.llm.engine import internals
from agent.llm.engine.linear_int4 import GROUP, Int4Linear, quantize_int4
from agent.llm.engine.linear_int8 import ROW_BLOCK, Int8Linear, OutputInt8Linear, quantize_int8
from agent.llm.engine.weights import speed_up
from agent.react import parse_react
from agent.steps import ToolRequest
from tests.real_model import real_model_test, started_local_llm, worker_log_watched

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
QUESTION = "请帮我查一下：我们的大模型技术实战课程目前一共上线了多少节？"


def layer(out_features: int = 96, in_features: int = 128, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Linear:
    torch.manual_seed(0)
    linear = torch.nn.Linear(in_features, out_features, dtype=dtype)
    with torch.no_grad():
        linear.weight.normal_(0, 0.05)
    return linear


def tiny_qwen(dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """A Qwen2 model whose layers all fit the int4 kernel (inputs multiples of 32, outputs of 16)."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).to(dtype).eval()


def greedy(model: torch.nn.Module, tokens: int = 8) -> list[int]:
    ids = torch.tensor([[5, 17, 42, 9, 77]])
    with torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False,
                              pad_token_id=0)[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("kind", [Int8Linear, Int4Linear, OutputInt8Linear])
def test_a_quantized_layer_computes_linear_over_its_rounded_weights(kind) -> None:
    linear = layer()
    inputs = torch.randn(6, 3, 128).to(torch.bfloat16)
    with torch.inference_mode():
        got = kind(linear)(inputs).float()
        expected = torch.nn.functional.linear(inputs.float(), kind.rounded(linear.weight), linear.bias.float())
    assert got.shape == (6, 3, 96) and got.dtype == torch.float32
    assert float((got - expected).abs().max() / expected.abs().max()) < 0.03
    # and the rounding is a quantizer's, not the identity: the rounded weights differ from the layer's
    assert not torch.equal(kind.rounded(linear.weight), linear.weight.float())


def test_int4_levels_already_on_a_16_step_grid_come_back_to_bf16_rounding() -> None:
    """A 4-bit GGUF de-quantized (a Q4_1 block: 32 weights = minimum + level × step) quantizes back to its levels."""
    torch.manual_seed(1)
    levels = torch.randint(0, 16, (32, 128))
    levels[:, ::GROUP] = 0  # each block uses its lowest and highest level, as a block of real weights does
    levels[:, 1::GROUP] = 15
    steps = torch.rand(32, 128 // GROUP, 1) * 0.01 + 0.001
    lows = torch.randn(32, 128 // GROUP, 1) * 0.05
    weight = (lows + levels.reshape(32, -1, GROUP) * steps).reshape(32, 128)
    assert float((Int4Linear.rounded(weight) - weight).abs().max()) < 0.004 * float(weight.abs().max())


@pytest.mark.parametrize("kind", [Int4Linear, OutputInt8Linear, Int8Linear])
def test_a_row_is_computed_on_its_own_whatever_else_the_batch_holds(kind) -> None:
    """`Int8Linear` too: fbgemm scales the activations over the whole batch, but each row comes to it divided by
    its own largest magnitude (one row 40 times larger than the others changes none of theirs)."""
    linear = kind(layer())
    rows = torch.randn(7, 128).to(torch.bfloat16)
    rows[3] *= 40
    with torch.inference_mode():
        together = linear(rows)
        for index in range(7):
            assert torch.equal(linear(rows[index:index + 1])[0], together[index])


def test_a_prompt_longer_than_a_block_of_rows_gives_what_each_row_gives_alone() -> None:
    linear = Int8Linear(layer())
    rows = torch.randn(2 * ROW_BLOCK + 37, 128).to(torch.bfloat16)
    with torch.inference_mode():
        together = linear(rows[None])[0]
        for index in (0, ROW_BLOCK - 1, ROW_BLOCK, 2 * ROW_BLOCK + 36):
            assert torch.equal(linear(rows[index:index + 1])[0], together[index])


def test_quantized_weights_hold_less_than_bf16() -> None:
    linear = layer(out_features=256, in_features=512)
    bf16_bytes = linear.weight.nbytes
    assert Int8Linear(linear).nbytes < 0.51 * bf16_bytes and OutputInt8Linear(linear).nbytes < 0.51 * bf16_bytes
    assert Int4Linear(linear).nbytes <= 0.3125 * bf16_bytes  # 4 bits and a bf16 scale and zero per 32 weights


def test_int4_puts_the_output_layer_in_int8_and_leaves_layers_the_kernel_cannot_take() -> None:
    model = quantize_int4(tiny_qwen())
    assert type(model.lm_head) is OutputInt8Linear
    assert type(model.model.layers[0].mlp.down_proj) is Int4Linear
    odd = torch.nn.Sequential(torch.nn.Linear(40, 64, dtype=torch.bfloat16))  # 40 inputs: not groups of 32
    quantize_int4(odd)
    assert type(odd[0]) is torch.nn.Linear


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_a_quantized_model_generates_close_to_its_bf16_self_through_the_engines_pass(quantize: str) -> None:
    reference = greedy(tiny_qwen())
    model = speed_up(tiny_qwen(), on_gpu=False, quantize=quantize)
    assert internals.on_checked_path(model)  # the decode pass gave the forward's scores bit for bit
    quantized = [module for module in model.modules() if type(module) in (Int8Linear, Int4Linear)]
    assert len(quantized) == 2 * 4  # per layer: stacked q/k/v, o, stacked gate/up, down
    assert type(model.lm_head) is OutputInt8Linear
    tokens = greedy(model)
    assert len(tokens) == len(reference) and tokens[:2] == reference[:2]


@pytest.mark.parametrize("quantize, op", [("int8", "int8_linear"), ("int4", "int4_linear")])
def test_a_kernel_gone_from_torch_leaves_the_layers_as_loaded_with_one_line(monkeypatch, caplog, quantize: str,
                                                                             op: str) -> None:
    def gone(*args: object) -> torch.Tensor:
        raise AttributeError("'_OpNamespace' 'aten' object has no attribute 'gone'")

    monkeypatch.setattr(f"agent.llm.engine.linear_{quantize}.{op}", gone)
    reference = greedy(speed_up(tiny_qwen(), on_gpu=False))
    with caplog.at_level(logging.INFO, logger="agent.llm.engine"):
        model = speed_up(tiny_qwen(), on_gpu=False, quantize=quantize)
    assert not any(type(module) in (Int8Linear, Int4Linear, OutputInt8Linear) for module in model.modules())
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert warnings == [f"{quantize} weights are off, the linear layers stay as loaded: the {quantize} kernel fails "
                        "its check: AttributeError: '_OpNamespace' 'aten' object has no attribute 'gone'"]
    assert greedy(model) == reference


def test_quantize_int8_replaces_every_linear_layer_of_an_fp32_model_too() -> None:
    model = quantize_int8(tiny_qwen(torch.float32))
    assert not any(type(module) is torch.nn.Linear for module in model.modules())
    assert len(greedy(model)) == 8


# --- the real model on int4 weights ------------------------------------------------------------------------------

@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def int4_llm():
    backend = await started_local_llm(dtype="int4", prefix_cache_mb=None)  # None: auto, sized from the model
    yield backend
    await backend.close()


@real_model_test
async def test_int4_answers_in_one_batch_and_reuses_the_prefix_of_an_earlier_call(int4_llm) -> None:
    sizes: list[int] = []

    def note(message: str) -> None:
        if (found := re.match(r"generating a batch of (\d+) ", message)) is not None:
            sizes.append(int(found.group(1)))

    calls = [ModelRequest(FRANCE, max_new_tokens=12) for _ in range(3)]
    with worker_log_watched(note):
        busy = asyncio.create_task(int4_llm.complete(ModelRequest(FRANCE, max_new_tokens=2)))
        await asyncio.sleep(0.05)
        replies = await asyncio.gather(*(int4_llm.complete(call) for call in calls))
        await busy
    assert max(sizes) >= 3, sizes  # the three in one batch (beside the busy row, which pauses for them)
    assert all("Paris" in reply.text for reply in replies)
    again = await int4_llm.complete(ModelRequest(FRANCE, max_new_tokens=12))
    assert again.cached_tokens >= again.prompt_tokens - 1  # all but the last prompt token reused
    assert "Paris" in again.text


@real_model_test
async def test_int4_decodes_a_constrained_step_with_speculative_tokens_taken(int4_llm, turn_tools) -> None:
    taken: list[int] = []

    def note(message: str) -> None:
        if (found := re.search(r"(\d+) speculative tokens checked, (\d+) taken", message)) is not None:
            taken.append(int(found.group(2)))

    named = tuple(tool.name for tool in turn_tools if tool.named_in(QUESTION))
    conversation = ReactConversation([], QUESTION, turn_tools, TurnRules(GrammarLimits(thought_max_tokens=16), named))
    request = conversation.request()
    with worker_log_watched(note):
        # 96 tokens: a 16-token Thought, then up to ~60 of Action, the course and the fields it may ask for.
        step = await int4_llm.complete(ModelRequest(request.messages, stop=request.stop, max_new_tokens=96,
                                                    grammar=request.grammar))
        # the reply resolves as its row ends, the decode loop logs its count after: one more call on the (serial)
        # model thread waits for that line
        await int4_llm.complete(ModelRequest(FRANCE, max_new_tokens=1))
    decision = parse_react(step.text, turn_tools)
    assert isinstance(decision, ToolRequest) and decision.input_error is None, step.text
    assert sum(taken) > 0  # the grammar's forced text was checked as speculative tokens and taken


def test_auto_quantizes_to_int8_on_a_cpu_from_a_billion_decoder_weights_where_activations_keep_8_bits() -> None:
    from agent.llm.engine.loading import INT8_FROM_WEIGHTS, quantization

    eight_bits = internals.int8_activation_bits() == 8
    assert quantization("auto", on_gpu=False, linear_weights=INT8_FROM_WEIGHTS) == ("int8" if eight_bits else None)
    assert quantization("auto", on_gpu=False, linear_weights=INT8_FROM_WEIGHTS - 1) is None  # bf16 or fp32 below
    assert quantization("auto", on_gpu=True, linear_weights=10 * INT8_FROM_WEIGHTS) is None  # bf16 on a GPU
    assert quantization("bfloat16", on_gpu=False, linear_weights=10 * INT8_FROM_WEIGHTS) is None
    assert quantization("int4", on_gpu=False) == "int4" and quantization("int8", on_gpu=False) == "int8"


def test_int8_activations_keep_8_bits_where_the_product_does_not_overflow() -> None:
    """The probe behind `auto`'s choice: with 8 bits the rounding of a row's activations is half of 7 bits'."""
    linear = layer(out_features=256, in_features=512)
    rows = torch.randn(6, 512).to(torch.bfloat16)
    with torch.inference_mode():
        got = Int8Linear(linear)(rows).float()
    expected = torch.nn.functional.linear(rows.float(), Int8Linear.rounded(linear.weight), linear.bias.detach().float())
    error = float((got - expected).abs().max() / expected.abs().max())
    assert error < (0.012 if internals.int8_activation_bits() == 8 else 0.03)
