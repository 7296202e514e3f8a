"""The prompt prefix cache of the local backend: what it keeps, that it changes no output, that it stays within its
memory budget, and that a newcomer joins a running batch at the next step instead of waiting for it to end.

The real-model tests run SmolLM2-135M (GGUF) through `LocalLLM` twice, with the cache on and off; the first start
converts the GGUF into a temporary folder, the second loads that converted copy.
"""

from __future__ import annotations

import asyncio
import re

import pytest
import pytest_asyncio
import torch

from agent.llm.base import ModelRequest
from agent.llm.engine import own_model
from agent.llm.engine.kv_cache import batch_cache
from agent.llm.engine.batch import cache_argument, lay_out
from agent.llm.engine.linear_int8 import Int8Linear, OutputInt8Linear
from agent.llm.engine.check_record import RECORD_FILE
from agent.llm.engine.loading import converted_folder, load_model, resolve_model
from agent.llm.local import LocalLLM
from agent.llm.engine.prefix_store import CachedPrefix, Hit, PrefixStore
from agent.conversations import ReactConversation, TurnRules
from tests.real_model import GGUF, real_model_test, worker_log_watched
from tools.calculator import CALCULATOR

STOP = ["Observation:"]


def kv(length: int, width: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values of two layers for `length` tokens (`width` floats each)."""
    return [(torch.zeros(1, 1, length, width), torch.zeros(1, 1, length, width)) for _ in range(2)]


# --- the store -------------------------------------------------------------------------------------------------

def test_the_longest_shared_prefix_is_found_and_the_last_prompt_token_is_left_to_compute() -> None:
    store = PrefixStore(budget_bytes=1 << 20)
    store.put([1, 2, 3, 4, 5], kv(5))
    store.put([1, 2, 9], kv(3))
    assert store.longest([1, 2, 3, 7]).length == 3
    assert store.longest([1, 2, 9, 9]).length == 3
    assert store.longest([1, 2, 3, 4, 5]).length == 4  # all of it is stored, but the last token's logits are needed
    assert store.longest([8, 1, 2]).length == 0
    hit = store.longest([1, 2, 3, 4, 5, 6])
    assert [tuple(k.shape) for k, _ in hit.layers()] == [(1, 1, 5, 4), (1, 1, 5, 4)]


def test_a_sequence_that_grows_replaces_its_own_prefix() -> None:
    store = PrefixStore(budget_bytes=1 << 20)
    store.put([1, 2, 3], kv(3))
    store.put([1, 2, 3, 4, 5], kv(5))
    store.put([1, 2, 3, 4, 5, 6, 7], kv(7))
    assert len(store) == 1 and store.longest([1, 2, 3, 4, 5, 6, 7, 8]).length == 7


def test_a_hundred_conversations_stay_within_the_budget_and_the_recent_ones_are_kept() -> None:
    one_entry = sum(k.nelement() * 4 + v.nelement() * 4 for k, v in kv(40))
    store = PrefixStore(budget_bytes=10 * one_entry)
    system = list(range(1000, 1030))
    for turn in range(100):
        first = system + [turn, turn + 1]
        store.put(first + [7] * 4, kv(len(first) + 4))  # the first call's prompt and reply
        second = first + [7] * 4 + [turn] * 4
        store.put(second, kv(len(second)))  # the second call: contains the first, which is dropped
        assert store.nbytes <= store.budget_bytes
    assert 10 < len(store) < 100  # the system prompt held once: more conversations than 10 whole ones
    assert store.longest(system + [99, 100, 7, 7]).length == 33  # the newest conversation is still there
    assert store.longest(system + [0, 1, 7, 7]).length == 30  # the oldest is gone; the system prompt is not


def test_an_entry_larger_than_the_budget_is_not_kept_and_a_zero_budget_keeps_nothing() -> None:
    store = PrefixStore(budget_bytes=100)
    store.put(list(range(50)), kv(50))
    assert len(store) == 0
    off = PrefixStore(budget_bytes=0)
    off.put([1, 2, 3], kv(3))
    assert len(off) == 0 and off.longest([1, 2, 3, 4]).length == 0

def numbered_kv(tokens: list[int], width: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values of two layers where each position's vector says which token sequence led to it: a hash
    of the tokens up to it (as a real model's KV depends on exactly those)."""
    codes = torch.tensor([float(hash(tuple(tokens[: i + 1])) % 10007) for i in range(len(tokens))])
    keys = codes.view(1, 1, -1, 1).expand(1, 1, len(tokens), width).clone()
    return [(keys, -keys) for _ in range(2)]

def test_a_hit_extended_by_new_tokens_holds_the_kv_of_every_position_and_hands_over_only_the_new_ones() -> None:
    store = PrefixStore(budget_bytes=1 << 20)
    first = list(range(50))
    store.put(first, numbered_kv(first))
    wanted = first[:30] + [7] * 10
    hit = store.longest(wanted)  # the first 30 of a 50-token run
    new_kv = [(k[:, :, 30:].clone(), v[:, :, 30:].clone()) for k, v in numbered_kv(wanted)]
    longer = hit.then(CachedPrefix(torch.tensor(wanted[30:]), new_kv))
    assert longer.length == 40 and [len(run) for run in longer.runs] == [30, 10]
    assert torch.equal(longer.layers()[0][0], numbered_kv(wanted)[0][0])
    assert torch.equal(longer.layers(start=30)[0][0], new_kv[0][0])
    store.put(wanted, longer.layers(30), 30)
    assert store.nbytes == sum(k.nelement() * 4 * 2 for k, _ in numbered_kv(first + [7] * 10))
    assert store.longest(wanted + [1]).length == 40 and store.longest(first + [1]).length == 50


def test_conversations_sharing_a_system_prompt_hold_it_once_and_each_reuses_its_own_kv() -> None:
    system = list(range(1000, 1100))
    per_token = sum(k[:, :, :1].nelement() * 4 * 2 for k, _ in numbered_kv([1]))
    store = PrefixStore(budget_bytes=1 << 20)
    chats = [system + [chat] * 10 for chat in range(20)]
    for tokens in chats:
        store.put(tokens, numbered_kv(tokens))
    assert len(store) == 20 and store.nbytes == (100 + 20 * 10) * per_token  # 20 whole copies would be 2,200
    for tokens in chats:
        hit = store.longest(tokens + [5])
        assert hit.length == 110
        assert all(torch.equal(got, want) for got, want in zip(hit.layers()[0], numbered_kv(tokens)[0]))


def test_a_hit_stays_valid_when_a_later_sequence_splits_the_run_it_reuses() -> None:
    store = PrefixStore(budget_bytes=1 << 20)
    first = list(range(50))
    store.put(first, numbered_kv(first))
    hit = store.longest(first + [99])
    store.put(first[:20] + [7, 7, 7], numbered_kv(first[:20] + [7, 7, 7]))  # parts from the first at 20
    assert torch.equal(hit.layers()[1][0], numbered_kv(first)[1][0])
    assert store.longest(first + [99]).length == 50 and len(store.longest(first + [99]).runs) == 2
    assert store.longest(first[:20] + [7, 7, 7, 1]).length == 23


def test_the_store_keeps_its_own_copy_of_columns_handed_over_as_part_of_a_larger_tensor() -> None:
    store = PrefixStore(budget_bytes=1 << 20)
    tokens = list(range(40))
    whole = numbered_kv(tokens)
    store.put(tokens[:10], [(k[:, :, :10], v[:, :, :10]) for k, v in whole])  # views of 40 columns
    store.put(tokens, [(k[:, :, 10:], v[:, :, 10:]) for k, v in whole], start=10)
    held = [run.layers[0][0] for run in store.longest(tokens + [1]).runs]
    assert [t.shape[2] for t in held] == [10, 30]
    assert [t.untyped_storage().nbytes() for t in held] == [t.nelement() * 4 for t in held]
    assert torch.equal(torch.cat(held, dim=2), whole[0][0])


def test_a_budget_drops_the_least_recently_used_conversation_first_and_keeps_the_shared_prompt() -> None:
    system = list(range(1000, 1100))
    per_token = sum(k[:, :, :1].nelement() * 4 * 2 for k, _ in numbered_kv([1]))
    store = PrefixStore(budget_bytes=(100 + 3 * 10) * per_token)  # the system prompt and three chats' own tokens
    for chat in range(3):
        store.put(system + [chat] * 10, numbered_kv(system + [chat] * 10))
    store.longest(system + [0] * 10 + [1])  # chat 0 asks again: chat 1 is now the least recently used
    store.put(system + [3] * 10, numbered_kv(system + [3] * 10))
    assert store.nbytes <= store.budget_bytes and len(store) == 3
    assert store.longest(system + [1] * 10 + [5]).length == 100  # chat 1's own tokens went, the prompt stayed
    assert store.longest(system + [0] * 10 + [5]).length == 110
    assert store.longest(system + [3] * 10 + [5]).length == 110


# --- the real model --------------------------------------------------------------------------------------------

@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backends(tmp_path_factory):
    """The same model twice: without a prefix cache, and with one of 64 MiB."""
    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is missing: run scripts/fetch_assets.sh (scripts/test.sh does)")
    converted = tmp_path_factory.mktemp("converted")
    plain = LocalLLM(str(GGUF), device_map="cpu", dtype="float32", converted_dir=converted, prefix_cache_mb=0)
    cached = LocalLLM(str(GGUF), device_map="cpu", dtype="float32", converted_dir=converted, prefix_cache_mb=64)
    await plain.start()
    await cached.start()
    yield plain, cached, converted
    await plain.close()
    await cached.close()


def react_turn(question: str, history: tuple[dict, ...] = (), layout: str = "system") -> list[dict]:
    """The messages of a turn's first model call, as the agent renders them."""
    return ReactConversation(history, question, [CALCULATOR], TurnRules(react_layout=layout)).request().messages


def continued(messages: list[dict], reply: str, observation: str) -> list[dict]:
    """The next call of the same turn: the assistant's trace so far, with the tool's observation."""
    return [*messages, {"role": "assistant", "content": f"{reply}\nObservation: {observation}\nThought:"}]


@real_model_test
async def test_the_first_start_converts_the_gguf_and_the_second_loads_the_converted_copy(backends) -> None:
    plain, cached, converted = backends
    folder = converted_folder(resolve_model(str(GGUF)), torch.float32, converted)
    assert folder is not None and (folder / "converted.ok").is_file() and (folder / "config.json").is_file()
    # no half-written copy left behind; beside the copy, the record of the load checks it passed (check_record.py)
    assert sorted(path.name for path in converted.iterdir()) == sorted([folder.name, RECORD_FILE])
    reply = await cached.complete(ModelRequest([{"role": "user", "content": "What is the capital of France?"}],
                                               max_new_tokens=8))
    assert reply.text.startswith("The capital of France is")  # the converted copy is the same model


@real_model_test
async def test_outputs_with_the_cache_equal_outputs_without_it_and_the_prompt_is_reused(backends) -> None:
    plain, cached, _ = backends
    results = {}
    for name, llm in (("plain", plain), ("cached", cached)):
        first = react_turn("What is 12 * 7?")
        one = await llm.complete(ModelRequest(first, stop=STOP, max_new_tokens=24))
        two = await llm.complete(ModelRequest(continued(first, one.text, "84"), stop=STOP, max_new_tokens=24))
        other = await llm.complete(ModelRequest(react_turn("What is 3 + 5?"), stop=STOP, max_new_tokens=24))
        results[name] = [one, two, other]
    assert [c.text for c in results["cached"]] == [c.text for c in results["plain"]]
    one, two, other = results["cached"]
    assert one.cached_tokens < 0.1 * one.prompt_tokens  # only the template's opening was seen before
    assert two.cached_tokens > 0.8 * two.prompt_tokens  # the whole first call was reused
    assert other.cached_tokens > 0.8 * other.prompt_tokens  # another chat reuses the system prompt and tools
    assert all(c.cached_tokens == 0 for c in results["plain"])


@real_model_test
@pytest.mark.parametrize("layout", ["system", "question"])
async def test_a_chats_next_turn_computes_only_its_new_text_when_the_tools_lead_the_prompt(backends, layout) -> None:
    """REACT_LAYOUT=system: the next turn's prompt is the last one's up to its answer, then the answer and the new
    question; with Qwen's layout the instructions and tools follow the history, so they are computed again."""
    _, cached, _ = backends
    first = await cached.complete(ModelRequest(react_turn("What is 12 * 7?", layout=layout), stop=STOP,
                                               max_new_tokens=8))
    history = ({"role": "user", "content": "What is 12 * 7?"}, {"role": "assistant", "content": "84"})
    second = await cached.complete(ModelRequest(react_turn("And 84 / 2?", history, layout), stop=STOP,
                                                max_new_tokens=8))
    computed = second.prompt_tokens - second.cached_tokens
    if layout == "system":
        assert computed <= 0.25 * second.prompt_tokens
    else:
        assert computed > 0.5 * second.prompt_tokens
    assert first.prompt_tokens < second.prompt_tokens


@real_model_test
async def test_the_prefix_two_new_chats_share_is_computed_once_and_counted_once(backends) -> None:
    _, cached, _ = backends
    cached._thread.prefix_store = store = PrefixStore(64 << 20)  # nothing known yet
    questions = ("What is 2 + 2?", "What is 9 - 4?")
    first, second = await asyncio.gather(*(cached.complete(ModelRequest(react_turn(q), stop=STOP, max_new_tokens=4))
                                           for q in questions))
    assert store.computed_tokens + store.reused_tokens == first.prompt_tokens + second.prompt_tokens
    low, high = sorted([first, second], key=lambda c: c.cached_tokens)
    assert low.cached_tokens == 0  # one row computed the system prompt and tools...
    assert high.cached_tokens > 0.8 * high.prompt_tokens  # ...and the other reused them, in its batch or after it


@real_model_test
async def test_chats_at_once_read_the_tools_prompt_once_a_step_and_answer_as_without_the_cache(backends) -> None:
    """Rows that reuse the same tools prompt hold the same KV for it: the decode attention reads it once for the
    whole batch (attention.py). First calls reuse one stored entry; second calls their own, checked equal."""
    plain, cached, _ = backends
    questions = ("What is 12 * 7?", "What is 3 + 5?", "What is 81 / 9?")
    # the tools prompt stored
    await cached.complete(ModelRequest(react_turn("What is 1 + 1?"), stop=STOP, max_new_tokens=2))
    results = {}
    logged: list[str] = []
    with worker_log_watched(logged.append):
        for name, llm in (("plain", plain), ("cached", cached)):
            firsts = [react_turn(question) for question in questions]
            ones = await asyncio.gather(*(llm.complete(ModelRequest(first, stop=STOP, max_new_tokens=16))
                                          for first in firsts))
            twos = await asyncio.gather(*(llm.complete(ModelRequest(continued(first, one.text, "42"), stop=STOP,
                                                                    max_new_tokens=16))
                                          for first, one in zip(firsts, ones)))
            results[name] = [reply.text for reply in (*ones, *twos)]
    assert results["cached"] == results["plain"]
    shared = [int(found[1]) for message in logged
              if (found := re.search(r"(\d+) columns the same in every row", message))]
    tools_prompt = 0.5 * min(reply.prompt_tokens for reply in ones)
    assert len([columns for columns in shared if columns > tools_prompt]) >= 2, logged  # first and second calls


@real_model_test
async def test_a_hundred_turns_keep_the_cache_within_its_budget(backends) -> None:
    _, cached, _ = backends
    store = cached._thread.prefix_store
    store.budget_bytes = 4 << 20  # a small budget, so that the soak really evicts
    for turn in range(100):
        first = [{"role": "user", "content": f"Question {turn}: what is {turn} plus {turn}?"}]
        reply = await cached.complete(ModelRequest(first, max_new_tokens=2))
        await cached.complete(ModelRequest([*first, {"role": "assistant", "content": reply.text + " so"}],
                                           max_new_tokens=1))
        assert store.nbytes <= store.budget_bytes
    assert 0 < len(store) < 100


@real_model_test
async def test_a_newcomer_joins_a_running_generation_instead_of_waiting_for_its_end(backends) -> None:
    _, cached, _ = backends
    long = asyncio.create_task(cached.complete(ModelRequest(
        [{"role": "user", "content": "Write a long story about a lighthouse keeper."}], max_new_tokens=256)))
    while not cached._thread.prefix_store.computed_tokens or not cached._thread._current:
        await asyncio.sleep(0.05)  # until the long generation is under way
    short = await cached.complete(ModelRequest([{"role": "user", "content": "Say hi."}], max_new_tokens=4))
    assert short.completion_tokens == 4
    assert not long.done()  # answered while the long one still generates
    story = await long
    assert story.completion_tokens > 100 and story.text.strip()


@real_model_test
async def test_a_newcomer_is_prefilled_alone_and_both_rows_answer_as_they_would_alone(backends) -> None:
    """A newcomer's own tokens are computed on their own before it joins, not once per row of the batch: the
    joined batch computes one column. Neither its answer nor the running row's text changes for it."""
    plain, cached, _ = backends
    story, question = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}], \
        react_turn("What is 6 * 7? Answer in one word.")
    story_alone = await plain.complete(ModelRequest(story, max_new_tokens=48))
    answer_alone = await plain.complete(ModelRequest(question, stop=STOP, max_new_tokens=12))
    logged: list[str] = []
    with worker_log_watched(logged.append):
        running = asyncio.create_task(cached.complete(ModelRequest(story, max_new_tokens=48)))
        while not any(message.startswith("batch of 1:") for message in logged):
            await asyncio.sleep(0.01)  # until the story is being generated
        answer = await cached.complete(ModelRequest(question, stop=STOP, max_new_tokens=12))
        story_joined = await running
    assert answer.text == answer_alone.text and story_joined.text == story_alone.text
    joined = [message for message in logged if message.startswith("batch of 2:")]
    assert joined and joined[0].endswith("computed 1 columns"), logged


@real_model_test
async def test_a_paused_row_resumes_from_its_own_kv_even_when_the_store_cannot_keep_it(backends) -> None:
    """A paused row is live work: its KV stays with it, not in the bounded store, whose LRU would drop it under a
    full batch and make the next batch recompute its whole prompt. With a store too small for any row, the newcomer
    still joins and the resumed row computes only its last token."""
    plain, cached, _ = backends
    store = cached._thread.prefix_store = PrefixStore(budget_bytes=1024)  # less than one token's KV in 30 layers
    story, question = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}], \
        [{"role": "user", "content": "Say hi."}]
    story_alone = await plain.complete(ModelRequest(story, max_new_tokens=48))
    logged: list[str] = []
    with worker_log_watched(logged.append):
        running = asyncio.create_task(cached.complete(ModelRequest(story, max_new_tokens=48)))
        while not any(message.startswith("batch of 1:") for message in logged):
            await asyncio.sleep(0.01)  # until the story is being generated
        hi = await cached.complete(ModelRequest(question, max_new_tokens=4))
        story_joined = await running
    assert hi.completion_tokens == 4 and story_joined.text == story_alone.text
    joined = [message for message in logged if message.startswith("batch of 2:")]
    assert joined and joined[0].endswith("computed 1 columns"), logged
    assert len(store) == 0  # the store kept nothing: the story resumed from the KV it held itself


@real_model_test
async def test_generate_through_the_batch_cache_writes_the_tokens_transformers_own_cache_writes(
        backends, monkeypatch) -> None:
    """The batch's roomy cache (batch_kv.py) against transformers' default one, on three prompts of different
    lengths (so with padding), through transformers' own model class and its `generate`."""
    _, _, converted = backends
    monkeypatch.setattr(own_model, "buildable", lambda folder: "transformers' classes, for `generate`")
    loaded = load_model(resolve_model(str(GGUF)), "cpu", "float32", converted_dir=converted)
    model, tokenizer = loaded.model, loaded.tokenizer
    prompts = [tokenizer(text)["input_ids"] for text in ("The capital of France is", "One, two, three, four,",
                                                         "A haiku about the sea:")]
    layout = lay_out(prompts, [0, 0, 0], tokenizer.pad_token_id or 0, model.device)
    options = dict(input_ids=layout.input_ids, attention_mask=layout.attention_mask, max_new_tokens=12,
                   do_sample=False, pad_token_id=tokenizer.pad_token_id or 0)
    with torch.inference_mode():
        plain = model.generate(**options)
        room = batch_cache(model, [Hit(None, 0)] * 3, 0, layout.input_ids.shape[1], 12)
        roomy = model.generate(**options, **{cache_argument(model): room})
    assert torch.equal(plain, roomy)
    assert room.layers[0].length == layout.input_ids.shape[1] + 11  # generate wrote into it (the last token is not fed)


@real_model_test
async def test_int8_stacks_each_layers_projections_before_quantizing_them(backends) -> None:
    """MODEL_DTYPE=int8: query/key/value and gate/up are one int8 product each (fused_linear.py), so a decode
    step makes 4 quantized products a layer, not 7; tests/test_fused_linear.py checks the tokens do not change."""
    _, _, converted = backends
    model = load_model(resolve_model(str(GGUF)), "cpu", "int8", converted_dir=converted).model
    quantized = [module for module in model.modules() if isinstance(module, Int8Linear)]
    layers = model.config.num_hidden_layers
    assert len(quantized) == 4 * layers and type(model.lm_head) is OutputInt8Linear  # its inputs unrounded
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attention.qkv_proj.stacked in quantized and mlp.gate_up_proj.stacked in quantized
    assert attention.qkv_proj.stacked.out_features == (model.config.num_attention_heads
                                                       + 2 * model.config.num_key_value_heads) * attention.head_dim
