"""The batch's KV cache (engine/kv_cache.py): written in place and grown a block at a time, it must hold exactly
what transformers' concatenating `DynamicLayer` would (`generate` through it on the real model:
test_prefix_store.py)."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from agent.llm.engine.kv_cache import GROWTH_COLUMNS, MIN_SHARED_COLUMNS, RoomyLayer, batch_cache, shared_columns
from agent.llm.engine.prefix_store import MISS, CachedPrefix, Hit, PrefixStore


def steps(batch: int = 2, heads: int = 3, dim: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A prefill of 5 columns, then single-column steps: random keys and values, as a model would add them."""
    generator = torch.Generator().manual_seed(7)
    widths = [5, 1, 1, 1, 1]
    return [(torch.randn(batch, heads, w, dim, generator=generator), torch.randn(batch, heads, w, dim,
                                                                               generator=generator))
            for w in widths]


@pytest.mark.parametrize("room", [9, 3])  # the batch's announced room, and too little (it then grows)
def test_a_roomy_layer_holds_what_a_dynamic_layer_holds_after_every_update(room: int) -> None:
    roomy, reference = RoomyLayer(room), DynamicCache()
    for keys, values in steps():
        got = roomy.update(keys, values)
        expected = reference.update(keys, values, layer_idx=0)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
        assert roomy.get_seq_length() == reference.get_seq_length()


def test_a_layer_grows_a_block_at_a_time_keeping_its_columns_and_zeroing_the_new_ones() -> None:
    layer = RoomyLayer(6)
    first, second = steps()[:2]
    layer.update(*first)
    layer.update(*second)  # the sixth column: still within the room
    assert layer._keys.shape[2] == 6
    layer.update(torch.ones(2, 3, 2, 4), torch.ones(2, 3, 2, 4))  # two more: past the room
    assert layer._keys.shape[2] == 8 + GROWTH_COLUMNS and layer.get_seq_length() == 8
    assert torch.equal(layer.keys[:, :, :5], first[0]) and torch.equal(layer.values[:, :, 5:6], second[1])
    assert not layer._keys[:, :, 8:].any() and not layer._values[:, :, 8:].any()


def test_a_layer_in_a_narrower_dtype_holds_the_models_states_rounded_to_it_as_it_grows() -> None:
    layer = RoomyLayer(5, torch.bfloat16)
    for keys, values in steps():
        got_keys, got_values = layer.update(keys, values)
    everything = [torch.cat(parts, dim=2) for parts in zip(*steps())]
    assert got_keys.dtype == got_values.dtype == torch.bfloat16 and layer._keys.shape[2] > 5
    assert torch.equal(got_keys, everything[0].to(torch.bfloat16))
    assert torch.equal(got_values, everything[1].to(torch.bfloat16))


class OneLayer:  # what batch_cache reads of a model: its config's layer structure
    config = LlamaConfig(num_hidden_layers=1, num_attention_heads=3, num_key_value_heads=3, hidden_size=12)


def test_a_long_generation_gets_one_block_of_room_to_start_with() -> None:
    cache = batch_cache(OneLayer(), [MISS], cached=0, width=6, new_tokens=1000)
    cache.layers[0].update(torch.ones(1, 3, 6, 4), torch.ones(1, 3, 6, 4))
    assert cache.layers[0]._keys.shape[2] == 6 + GROWTH_COLUMNS


def test_rows_start_from_their_own_prefix_with_zeros_after_it() -> None:
    short = CachedPrefix(torch.arange(2), [(torch.ones(1, 3, 2, 4), 2 * torch.ones(1, 3, 2, 4))])
    long = CachedPrefix(torch.arange(4), [(3 * torch.ones(1, 3, 4, 4), 4 * torch.ones(1, 3, 4, 4))])

    model = OneLayer()
    cache = batch_cache(model, [Hit.whole(short).cut(2), Hit.whole(long).cut(4), MISS], cached=4, width=6, new_tokens=3)
    layer = cache.layers[0]
    assert isinstance(layer, RoomyLayer) and layer.get_seq_length() == 4 and layer._keys.shape[2] == 9
    assert torch.equal(layer.keys[0, :, :2], torch.ones(3, 2, 4)) and not layer.keys[0, :, 2:].any()
    assert torch.equal(layer.values[1], 4 * torch.ones(3, 4, 4))
    assert not layer.keys[2].any()


def stored(tokens: list[int], seed: int = 0, layers: int = 2) -> CachedPrefix:
    """A stored sequence whose KV at each position depends only on its seed (two sequences of one seed hold the
    same KV for their common positions, as copies of one computed prefix do)."""
    generator = torch.Generator().manual_seed(seed)
    kv = [(torch.randn(1, 3, 1000, 4, generator=generator), torch.randn(1, 3, 1000, 4, generator=generator))
          for _ in range(layers)]
    return CachedPrefix(torch.tensor(tokens), [(k[:, :, :len(tokens)].clone(), v[:, :, :len(tokens)].clone())
                                               for k, v in kv])


TOOLS = list(range(200))  # the tools prompt every chat starts with


def test_rows_reusing_one_entry_share_the_columns_all_of_them_reuse() -> None:
    tools = stored(TOOLS)
    assert shared_columns([Hit.whole(tools).cut(200), Hit.whole(tools).cut(180), Hit.whole(tools).cut(200)]) == 180


def test_rows_with_their_own_entries_share_the_tokens_they_start_with_where_their_kv_is_the_same() -> None:
    one, two = stored(TOOLS + [7, 8, 9]), stored(TOOLS + [5, 6])
    assert shared_columns([Hit.whole(one).cut(203), Hit.whole(two).cut(202)]) == 200


def test_rows_whose_kv_differs_in_the_bits_share_nothing() -> None:
    one, two = stored(TOOLS + [7, 8, 9]), stored(TOOLS + [5, 6])
    two.layers[1][1][0, 2, 150, 3] += 1e-6  # computed in another batch: one value rounded otherwise
    assert shared_columns([Hit.whole(one).cut(203), Hit.whole(two).cut(202)]) == 0


def test_one_row_or_a_short_common_prefix_shares_nothing() -> None:
    tools = stored(TOOLS)
    assert shared_columns([Hit.whole(tools).cut(200)]) == 0
    assert shared_columns([Hit.whole(tools).cut(MIN_SHARED_COLUMNS - 1), Hit.whole(tools).cut(200)]) == 0
    assert shared_columns([Hit.whole(tools).cut(200), MISS]) == 0
    early = stored(TOOLS[:100] + [999] * 100)  # the same KV, but other tokens from the 101st on
    assert shared_columns([Hit.whole(tools).cut(200), Hit.whole(early).cut(200)]) == 0


def test_rows_reusing_runs_of_the_store_get_each_position_s_own_kv_and_share_the_runs_they_have_in_common() -> None:
    store = PrefixStore(budget_bytes=1 << 30)
    for tail in ([7, 8, 9], [5, 6]):
        whole = stored(TOOLS + tail)  # one seed: the same KV for the tools prompt, as one computed prefix
        store.put(whole.tokens.tolist(), whole.layers)
    one, two = store.longest(TOOLS + [7, 8, 9, 1]), store.longest(TOOLS + [5, 6, 1])
    assert (one.length, two.length) == (203, 202) and len(one.runs) == len(two.runs) == 2
    assert one.runs[0] is two.runs[0]  # the tools prompt, held once
    assert shared_columns([one, two]) == 200

    cache = batch_cache(OneLayer(), [one, two], cached=203, width=204, new_tokens=4)
    expected = stored(TOOLS + [7, 8, 9], layers=1).layers[0][0]
    assert torch.equal(cache.layers[0].keys[0:1], expected)
    assert torch.equal(cache.layers[0].keys[1:2, :, :202], expected[:, :, :202])
    assert not cache.layers[0].keys[1, :, 202:].any()
