"""A decode step's own pass (agent/llm/engine/forward_pass.py): the scores of the model's forward, bit for bit, for the
models it mirrors, and the model's forward for every other."""

from __future__ import annotations

import pytest
import torch
from accelerate.hooks import ModelHook, add_hook_to_module
from transformers import (DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

from agent.llm.engine import forward_pass
from agent.llm.engine.attention import shared_prefix, use_decode_attention
from agent.llm.engine.kv_cache import batch_cache
from agent.llm.engine.decode_loop import cache_argument
from agent.llm.engine.linear_fused import fuse_projections
from agent.llm.engine.linear_int8 import quantize_int8

SIZES = dict(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
             num_key_value_heads=2)


def tiny(kind: str, form: str = "float32", **config: object) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "qwen2":  # biases on query, key and value
        model = Qwen2ForCausalLM(Qwen2Config(**SIZES, **config)).eval()
    else:
        model = LlamaForCausalLM(LlamaConfig(**SIZES, **config)).eval()
    use_decode_attention(model)
    if form == "stacked":
        fuse_projections(model)
    if form == "int8":
        fuse_projections(model)
        model = quantize_int8(model)
    return model


def through_forward(model, ids, mask, positions, cache, keep, **attention) -> torch.Tensor:
    output = model(input_ids=ids, attention_mask=mask, position_ids=positions, **{cache_argument(model): cache},
                   use_cache=True, logits_to_keep=keep, **attention)
    return output.logits.float()


def prompted(model, rows: int, shared: int):
    """A batch cache holding a laid-out prompt (its rows' first `shared` tokens the same, the second row padded)
    and its mask; the same prompt's cache twice, one for each way of passing."""
    torch.manual_seed(3)
    ids = torch.randint(1, 64, (rows, 12))
    ids[:, :shared] = ids[0, :shared]
    mask = torch.ones_like(ids)
    if rows > 1:
        mask[1, shared:shared + 3] = 0  # padding between a row's reused prefix and its own tokens
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    caches = []
    with torch.inference_mode():
        for _ in range(2):
            cache = batch_cache(model, [], 0, ids.shape[1], 32)
            through_forward(model, ids, mask, positions, cache, 1)
            caches.append(cache)
    return caches, mask, positions[:, -1] + 1


def steps(model, rows: int = 3, shared: int = 0) -> None:
    """Eight steps of one to four tokens a row (speculative), holes left where a guess was rejected: the same scores
    and the same KV through both ways."""
    (own, theirs), mask, positions = prompted(model, rows, shared)
    attention = shared_prefix(model, shared)
    torch.manual_seed(4)
    with torch.inference_mode():
        for step in range(8):
            width = 1 + step % 4
            ids = torch.randint(1, 64, (rows, width))
            mask = torch.cat([mask, torch.ones(rows, width, dtype=torch.long)], dim=1)
            columns = positions[:, None] + torch.arange(width)
            assert forward_pass.fits(model, own, width)
            ours = forward_pass.decode_pass(model, ids, mask, columns, own, width, **attention)
            expected = through_forward(model, ids, mask, columns, theirs, width, **attention)
            assert torch.equal(ours, expected), step
            mask[0, mask.shape[1] - width + 1:] = 0  # the first row took one token: its guess's columns are holes
            positions += torch.tensor([1] + [width] * (rows - 1))
    for mine, reference in zip(own.layers, theirs.layers):
        assert torch.equal(mine.keys, reference.keys) and torch.equal(mine.values, reference.values)


@pytest.mark.parametrize("form", ["float32", "stacked", "int8"])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_decode_step_gives_the_model_forwards_scores_and_kv_bit_for_bit(kind: str, form: str) -> None:
    steps(tiny(kind, form))


@pytest.mark.parametrize("form", ["float32", "int8"])
def test_rows_reading_their_shared_prefix_once_give_the_same_scores(form: str) -> None:
    steps(tiny("llama", form), rows=4, shared=6)


def test_one_row_gives_the_same_scores() -> None:
    steps(tiny("llama", "stacked"), rows=1)


def test_prompts_other_caches_attention_models_and_hooked_models_keep_the_models_forward() -> None:
    model = tiny("llama")
    cache = batch_cache(model, [], 0, 12, 32)
    assert forward_pass.fits(model, cache, 16)
    assert not forward_pass.fits(model, cache, 17)  # a prompt: its tokens outweigh its calls
    assert not forward_pass.fits(model, DynamicCache(config=model.config), 1)  # transformers' own cache layers
    sdpa = LlamaForCausalLM(LlamaConfig(**SIZES)).eval()  # the GPU's attention, not the decode attention
    assert not forward_pass.fits(sdpa, batch_cache(sdpa, [], 0, 12, 32), 1)
    windowed = tiny("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert not forward_pass.fits(windowed, batch_cache(windowed, [], 0, 12, 32), 1)
    for hook in (lambda layer: add_hook_to_module(layer, ModelHook()),  # accelerate's, as offloading adds them
                 lambda layer: layer.register_forward_hook(lambda *args: None)):  # PyTorch's own
        hooked = tiny("llama", "int8")
        hook(hooked.model.layers[1].mlp.down_proj)
        assert not forward_pass.fits(hooked, batch_cache(hooked, [], 0, 12, 32), 1)
    torch.manual_seed(0)
    other = Qwen3ForCausalLM(Qwen3Config(**SIZES)).eval()  # norms on query and key: not mirrored
    use_decode_attention(other)
    assert not forward_pass.fits(other, batch_cache(other, [], 0, 12, 32), 1)
