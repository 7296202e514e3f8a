"""The engine's own Llama and Qwen2 models (agent/llm/engine/own_model.py): built from a folder transformers saved,
they give the scores and KV of transformers' own model classes bit for bit, through prompts and decode steps; a start
builds them without importing transformers' modeling code; what they do not build loads through transformers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

from agent.llm.base import ModelRequest
from agent.llm.engine import own_model
from agent.llm.engine.attention import use_decode_attention
from agent.llm.engine.decode_loop import cache_argument
from agent.llm.engine.internals import use_attention
from agent.llm.engine.kv_cache import batch_cache
from agent.llm.engine.loading import load_model, resolve_model
from tests.real_model import GGUF, real_model_test, started_local_llm, worker_log_watched

REPO = Path(__file__).resolve().parents[1]
SIZES = dict(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
             num_key_value_heads=2)


def saved(folder: Path, kind: str, **config: object) -> Path:
    """A tiny model of `kind` with random weights, saved by transformers in `folder` (fp32)."""
    sharded = {"max_shard_size": "40KB"} if config.pop("sharded", False) else {}
    torch.manual_seed(0)
    if kind == "qwen2":  # biases on query, key and value
        model = Qwen2ForCausalLM(Qwen2Config(**{**SIZES, **config}))
    elif kind == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**{**SIZES, **config}))
    else:
        model = LlamaForCausalLM(LlamaConfig(**{**SIZES, **config}))
    model.save_pretrained(folder, **sharded)
    return folder


def both(folder: Path, dtype: torch.dtype, attention: str = "decode") -> tuple[torch.nn.Module, torch.nn.Module]:
    """transformers' model and the engine's own, from the same folder, in `dtype`, with the same attention."""
    theirs = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    ours = own_model.build(folder, dtype)
    for model in (theirs, ours):
        use_decode_attention(model) if attention == "decode" else use_attention(model, attention)
    return theirs, ours


def run(model: torch.nn.Module, padded: bool) -> tuple[list[torch.Tensor], object]:
    """A 24-token prompt of three rows (the second padded, if `padded`), then six steps of one to four tokens a row,
    all through the model's forward over a batch cache: every pass's scores, and the cache."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 64, (3, 24), generator=generator)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :5] = 0
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    cache = batch_cache(model, [], 0, 24, 32)
    through = {cache_argument(model): cache}
    with torch.inference_mode():
        scores = [model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=0,
                        **through).logits.float()]
        following = positions[:, -1:] + 1
        for step in range(6):
            width = 1 + step % 4
            ids = torch.randint(1, 64, (3, width), generator=generator)
            mask = torch.cat([mask, torch.ones(3, width, dtype=torch.long)], dim=1)
            columns = following + torch.arange(width)
            scores.append(model(input_ids=ids, attention_mask=mask, position_ids=columns, use_cache=True,
                                logits_to_keep=width, **through).logits.float())
            following = following + width
    return scores, cache


def assert_same(theirs: torch.nn.Module, ours: torch.nn.Module, padded: bool = True) -> None:
    (expected, reference), (got, cache) = run(theirs, padded), run(ours, padded)
    assert all(torch.equal(mine, their) for mine, their in zip(got, expected))
    for mine, their in zip(cache.layers, reference.layers):
        assert torch.equal(mine.keys, their.keys) and torch.equal(mine.values, their.values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_an_own_model_gives_transformers_scores_and_kv_bit_for_bit(tmp_path, kind: str, dtype: torch.dtype) -> None:
    theirs, ours = both(saved(tmp_path, kind), dtype)
    assert type(ours) is own_model.CausalLM
    assert_same(theirs, ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_whole_unpadded_prompt_takes_the_causal_kernel_as_transformers_does(tmp_path, dtype: torch.dtype) -> None:
    assert_same(*both(saved(tmp_path, "qwen2"), dtype), padded=False)


def test_after_a_failed_check_sdpa_gives_transformers_sdpa_scores(tmp_path) -> None:
    assert_same(*both(saved(tmp_path, "llama"), torch.float32, attention="sdpa"))


def test_tied_and_sharded_weights_load_as_transformers_loads_them(tmp_path) -> None:
    theirs, ours = both(saved(tmp_path / "tied", "qwen2", tie_word_embeddings=True), torch.float32)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    assert_same(theirs, ours)
    folder = saved(tmp_path / "sharded", "llama", sharded=True)
    assert (folder / own_model.WEIGHTS_INDEX).is_file()
    assert_same(*both(folder, torch.float32))
    next(folder.glob("model-*.safetensors")).unlink()  # a download cut short: transformers' loading reports it
    assert own_model.buildable(folder) == "not every safetensors file"


def test_what_the_engine_does_not_build_is_named(tmp_path) -> None:
    assert own_model.buildable(saved(tmp_path / "plain", "llama")) is None
    rope = saved(tmp_path / "rope", "llama", rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                               "rope_theta": 10000.0})
    assert own_model.buildable(rope) == "rope scaling"
    windowed = saved(tmp_path / "windowed", "qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert own_model.buildable(windowed) == "sliding windows"
    assert own_model.buildable(saved(tmp_path / "qwen3", "qwen3")) == "architecture Qwen3ForCausalLM"
    assert own_model.buildable(tmp_path / "nothing").startswith("config.json:")


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """The test model's converted copy (its first start: transformers reads the GGUF)."""
    folder = tmp_path_factory.mktemp("converted")
    for dtype in ("float32", "auto"):
        load_model(resolve_model(str(GGUF)), "cpu", dtype, converted_dir=folder)
    return folder


@pytest.mark.real_model
def test_a_second_start_builds_the_model_without_transformers_modeling_code(converted) -> None:
    """What the start saves: no transformers model class, nor the torch compiler and distributed tensors they
    import, in a fresh process that loads the converted copy."""
    script = ("import sys; from pathlib import Path\n"
              "from agent.llm.engine.loading import load_model, resolve_model\n"
              f"loaded = load_model(resolve_model({str(GGUF)!r}), 'cpu', 'float32', converted_dir=Path(sys.argv[1]))\n"
              "heavy = ['transformers.modeling_utils', 'transformers.models.llama.modeling_llama', 'torch._dynamo',\n"
              "         'torch.distributed.tensor']\n"
              "print(type(loaded.model).__name__, [name for name in heavy if name in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", script, str(converted)], cwd=REPO, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "CausalLM []"


@pytest.mark.real_model
def test_a_converted_copy_tokenizes_as_the_ggufs_first_start_whatever_class_it_names(converted, tmp_path) -> None:
    """A qwen2 GGUF's copy names `Qwen2Tokenizer`, whose class builds its own pipeline from the vocabulary; the
    later starts read the copy's tokenizer.json as it is, as the first start (transformers reading the GGUF) had it."""
    from transformers import AutoTokenizer

    saved_copy = next(converted.glob(f"{GGUF.stem}-*-float32"))
    named = tmp_path / saved_copy.name
    named.mkdir()
    for path in saved_copy.iterdir():
        (named / path.name).symlink_to(path)
    (named / "tokenizer_config.json").unlink()
    settings = json.loads((saved_copy / "tokenizer_config.json").read_text())
    (named / "tokenizer_config.json").write_text(json.dumps({**settings, "tokenizer_class": "Qwen2Tokenizer"}))
    texts = ["emoji 🤖 tab\tnew\r\nline", "a\r\n\r\nb  \n\n c", "Thought: 42\nAction: course_search"]
    first = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    by_class = AutoTokenizer.from_pretrained(named)
    assert any(by_class(text).input_ids != first(text).input_ids for text in texts)  # what a later start would get
    later = load_model(resolve_model(str(GGUF)), "cpu", "float32", converted_dir=tmp_path).tokenizer
    assert [later(text).input_ids for text in texts] == [first(text).input_ids for text in texts]


CALLS = [dict(messages=[{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=16),
         dict(messages=[{"role": "user", "content": "Write a haiku about the sea."}], max_new_tokens=24)]


@real_model_test
@pytest.mark.parametrize("dtype", ["float32", "auto"])
async def test_the_test_model_answers_the_same_built_by_the_engine_or_by_transformers(
        converted, monkeypatch, dtype: str) -> None:
    replies, lines = [], []
    with worker_log_watched(lines.append):
        for builds in (True, False):
            if not builds:
                monkeypatch.setattr(own_model, "buildable", lambda folder: "transformers' classes, for this test")
            llm = await started_local_llm(converted_dir=converted, dtype=dtype)
            try:
                replies.append([(await llm.complete(ModelRequest(**call))).text for call in CALLS])
            finally:
                await llm.close()
    loaded = [line.rsplit(", ", 1)[1] for line in lines if line.startswith("loaded ")]
    assert loaded == ["built by the engine", "through transformers' model classes"]
    assert all(replies[0]) and replies[0] == replies[1]
