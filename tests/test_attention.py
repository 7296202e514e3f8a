"""The CPU decode attention (agent/llm/engine/attention.py): the same attention as sdpa's, so the same tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from agent.llm.engine import attention
from agent.llm.engine.attention import NAME, SHARED_COLUMNS, decode_attention, shared_prefix, use_decode_attention
from agent.llm.engine.internals import attention_implementation


class Module:  # what an attention function reads of its layer
    training = False
    is_causal = True
    num_key_value_groups = 3


def random_attention(width: int = 1, batch: int = 4, heads: int = 6, kv_heads: int = 2, length: int = 9,
                     dim: int = 8):
    """A query of `width` tokens per row at the end of `length` columns; the second row left-padded, and for a
    wider query the causal mask (each query token sees the columns up to its own)."""
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(batch, heads, width, dim, generator=generator)
    key = torch.randn(batch, kv_heads, length, dim, generator=generator)
    value = torch.randn(batch, kv_heads, length, dim, generator=generator)
    columns, rows = torch.arange(length), torch.arange(length - width, length)
    mask = (columns[None, :] <= rows[:, None]).expand(batch, 1, width, length).clone()
    mask[1, ..., :4] = False
    return query, key, value, mask


@pytest.mark.parametrize("width", [1, 3])  # a decode step, and a step that verifies two speculative tokens
def test_a_short_query_attends_as_sdpa_does_padding_and_grouped_heads_included(width: int) -> None:
    query, key, value, mask = random_attention(width)
    ours, _ = decode_attention(Module(), query, key, value, mask, scaling=0.3)
    theirs, _ = sdpa_attention_forward(Module(), query, key, value, mask, scaling=0.3)
    assert ours.shape == theirs.shape == (4, width, 6, 8)
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_without_a_mask_a_short_query_is_causal() -> None:
    query, key, value, mask = random_attention(width=3)
    mask[1] = mask[0]  # no padding: what transformers leaves out for sdpa, which is then causal
    ours, _ = decode_attention(Module(), query, key, value, None)
    theirs, _ = sdpa_attention_forward(Module(), query, key, value, mask)
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_an_additive_mask_hides_the_same_columns_as_a_boolean_one() -> None:
    query, key, value, mask = random_attention()
    additive = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    with_bool, _ = decode_attention(Module(), query, key, value, mask)
    with_additive, _ = decode_attention(Module(), query, key, value, additive)
    assert torch.allclose(with_bool, with_additive, atol=1e-6)


@pytest.mark.parametrize("width", [1, 3, 20])  # decode steps, and a prompt (sdpa's path)
def test_a_float32_query_over_a_bf16_cache_attends_in_bf16_and_answers_in_float32(width: int) -> None:
    query, key, value, mask = random_attention(width=width, length=24)
    narrow_key, narrow_value = key.to(torch.bfloat16), value.to(torch.bfloat16)
    ours, _ = decode_attention(Module(), query, narrow_key, narrow_value, mask)
    in_bf16, _ = decode_attention(Module(), query.to(torch.bfloat16), narrow_key, narrow_value, mask)
    exact, _ = sdpa_attention_forward(Module(), query, key, value, mask)
    assert ours.dtype == torch.float32 and torch.equal(ours, in_bf16.float())
    assert torch.allclose(ours, exact, atol=5e-2)


@pytest.mark.parametrize("width", [17, 40])
def test_a_bf16_prompt_attends_as_sdpa_does_padding_and_grouped_heads_included(width: int) -> None:
    query, key, value, mask = (tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
                               for tensor in random_attention(width=width, length=60))
    ours, _ = decode_attention(Module(), query, key, value, mask, scaling=0.3)
    theirs, _ = sdpa_attention_forward(Module(), query.float(), key.float(), value.float(), mask, scaling=0.3)
    assert ours.shape == theirs.shape == (4, width, 6, 8) and ours.dtype == torch.bfloat16
    assert torch.allclose(ours.float(), theirs, atol=3e-2)


def test_a_prompt_taken_a_few_query_tokens_at_a_time_attends_as_it_does_whole(monkeypatch) -> None:
    query, key, value, mask = (tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
                               for tensor in random_attention(width=40, length=60))
    whole, _ = decode_attention(Module(), query, key, value, mask)
    monkeypatch.setattr(attention, "PROMPT_SCORES", 4 * 6 * 60 * 7)  # 7 query tokens a chunk: 6 chunks
    chunked, _ = decode_attention(Module(), query, key, value, mask)
    assert torch.allclose(chunked.float(), whole.float(), atol=1e-2)


def test_a_float32_prompt_and_a_whole_prompt_without_a_mask_are_sdpa_s_own_attention() -> None:
    query, key, value, mask = random_attention(width=30, length=40)
    ours, _ = decode_attention(Module(), query, key, value, mask)
    theirs, _ = sdpa_attention_forward(Module(), query, key, value, mask)
    assert torch.equal(ours, theirs)
    query, key, value = (tensor.to(torch.bfloat16) for tensor in random_attention(width=30, length=30)[:3])
    ours, _ = decode_attention(Module(), query, key, value, None)
    assert torch.equal(ours, sdpa_attention_forward(Module(), query, key, value, None)[0])


@pytest.mark.parametrize("additive", [False, True])
def test_a_masked_float32_prompt_over_a_cache_with_room_is_sdpa_s_own_attention(additive: bool) -> None:
    query, key, value, mask = random_attention(width=30, length=40)  # the second row padded: a mask is needed
    if additive:
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    roomy_key, roomy_value = in_a_roomy_cache(key, 48), in_a_roomy_cache(value, 48)
    ours, _ = decode_attention(Module(), query, roomy_key, roomy_value, mask, scaling=0.3)
    theirs, _ = sdpa_attention_forward(Module(), query, key, value, mask, scaling=0.3)
    assert ours.shape == (4, 30, 6, 8)
    assert torch.equal(ours, theirs)


def in_a_roomy_cache(states: torch.Tensor, room: int) -> torch.Tensor:
    """`states` as batch_kv.py's `RoomyLayer` shows them: the first columns of a zeroed tensor with `room`."""
    whole = states.new_zeros(*states.shape[:2], room, states.shape[3])
    whole[:, :, : states.shape[2]] = states
    return whole[:, :, : states.shape[2]]


@pytest.mark.parametrize("room", [9, 12, 18, 40])  # no spare columns, a few, as many as filled, more than that
@pytest.mark.parametrize("with_mask", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_view_of_a_cache_with_room_attends_as_its_filled_columns_alone(room: int, with_mask: bool,
                                                                          dtype: torch.dtype) -> None:
    query, key, value, mask = (tensor.to(dtype) if tensor.is_floating_point() else tensor
                               for tensor in random_attention(width=3))
    if not with_mask:
        mask[1] = mask[0]
    roomy_key, roomy_value = in_a_roomy_cache(key, room), in_a_roomy_cache(value, room)
    ours, _ = decode_attention(Module(), query, roomy_key, roomy_value, mask if with_mask else None)
    alone, _ = decode_attention(Module(), query, key.clone(), value.clone(), mask if with_mask else None)
    assert ours.shape == alone.shape == (4, 3, 6, 8)
    assert torch.allclose(ours.float(), alone.float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_roomy_view_whose_spare_columns_hold_garbage_still_attends_to_its_filled_ones_only(
        dtype: torch.dtype) -> None:
    query, key, value, mask = (tensor.to(dtype) if tensor.is_floating_point() else tensor
                               for tensor in random_attention())
    roomy_key, roomy_value = in_a_roomy_cache(key, 12), in_a_roomy_cache(value, 12)
    roomy_key.as_strided((4, 2, 12, 8), roomy_key.stride())[:, :, 9:] = 1e4  # as if a rejected guess sat there
    roomy_value.as_strided((4, 2, 12, 8), roomy_value.stride())[:, :, 9:] = 1e4
    ours, _ = decode_attention(Module(), query, roomy_key, roomy_value, mask)
    theirs, _ = sdpa_attention_forward(Module(), query.float(), key.float(), value.float(), mask)
    assert torch.allclose(ours.float(), theirs, atol=1e-2 if dtype == torch.bfloat16 else 1e-5)


def test_only_a_bf16_view_is_widened_to_its_whole_room() -> None:
    _, key, _, _ = random_attention()  # 9 columns
    assert attention._whole_room(in_a_roomy_cache(key.to(torch.bfloat16), 10)).shape[2] == 10
    assert attention._whole_room(in_a_roomy_cache(key, 10)).shape[2] == 9  # float32 reads the view in place


def with_shared_columns(shared: int, width: int, dtype: torch.dtype = torch.float32):
    """`random_attention` over 20 columns whose first `shared` hold the same KV in every row, in a roomy cache
    (spare columns holding garbage), the second row padded after them. Shared columns come before the query's own,
    as a batch's reused prefix does: every query sees them."""
    query, key, value, mask = random_attention(width=width, length=20)
    key[:, :, :shared], value[:, :, :shared] = key[0, :, :shared], value[0, :, :shared]
    mask[1] = mask[0]
    mask[1, ..., shared:shared + 4] = False  # its own tokens come after a gap of padding
    query, key, value = (tensor.to(dtype) for tensor in (query, key, value))
    roomy_key, roomy_value = in_a_roomy_cache(key, 24), in_a_roomy_cache(value, 24)
    for states in (roomy_key, roomy_value):
        states.as_strided((4, 2, 24, 8), states.stride())[:, :, 20:] = 1e4
    return query, roomy_key, roomy_value, mask


@pytest.mark.parametrize("width", [1, 3])
@pytest.mark.parametrize("shared", [6, 12])
def test_columns_every_row_shares_read_once_attend_as_each_rows_own_copy(width: int, shared: int) -> None:
    query, key, value, mask = with_shared_columns(shared, width)
    ours, _ = decode_attention(Module(), query, key, value, mask, **{SHARED_COLUMNS: shared})
    theirs, _ = sdpa_attention_forward(Module(), query, key.clone(), value.clone(), mask)
    assert ours.shape == theirs.shape == (4, width, 6, 8)
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_a_bf16_cache_reads_every_rows_own_columns_whatever_it_is_told_they_share() -> None:
    query, key, value, mask = with_shared_columns(6, 1, torch.bfloat16)
    told, _ = decode_attention(Module(), query, key, value, mask, **{SHARED_COLUMNS: 6})
    untold, _ = decode_attention(Module(), query, key, value, mask)
    assert torch.equal(told, untold)


def test_only_the_decode_attention_is_told_of_shared_columns() -> None:
    model = tiny_model()
    assert shared_prefix(model, 700) == {}  # sdpa would not know the keyword
    use_decode_attention(model)
    assert shared_prefix(model, 700) == {SHARED_COLUMNS: 700} and shared_prefix(model, 0) == {}


def tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def greedy(model: LlamaForCausalLM) -> tuple[list[list[int]], torch.Tensor]:
    """Twelve greedy tokens for a padded batch of four, and the logits each step chose them from."""
    ids = torch.tensor([[0, 0, 5, 9, 11, 3], [7, 1, 2, 8, 4, 6], [3, 3, 9, 1, 2, 5], [0, 0, 0, 4, 4, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1] * 6, [0, 0, 0, 1, 1, 1]])  # two left-padded
    with torch.inference_mode():
        output = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    return output.sequences[:, ids.shape[1]:].tolist(), torch.stack(output.logits)


def test_a_model_generates_the_same_tokens_with_the_decode_attention_as_with_sdpa() -> None:
    model = tiny_model()
    tokens_sdpa, logits_sdpa = greedy(model)
    use_decode_attention(model)
    assert attention_implementation(model) == NAME
    tokens, logits = greedy(model)
    assert tokens == tokens_sdpa
    assert torch.allclose(logits, logits_sdpa, atol=1e-5)
