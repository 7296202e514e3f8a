"""int8 weights saved once quantized (engine/saved_int8.py): a later start reads them and computes the same scores,
bit for bit, without quantizing; another model, a damaged or unwritable folder and the kept count behave."""

from __future__ import annotations

import gc
import logging
import os
import shutil
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agent.llm.base import ModelRequest
from agent.llm.engine import internals, linear_int8
from agent.llm.engine.check_record import CheckRecord
from agent.llm.engine.linear_int8 import Int8Linear, OutputInt8Linear, PackedBytes
from agent.llm.engine.saved_int8 import (COMPLETE_MARK, FOLDER, RAW_SUFFIX, STALE_SECONDS, SavedLevels,
                                         saved_levels)
from agent.llm.engine.weights import speed_up
from tests.real_model import real_model_test, started_local_llm, worker_log_watched

PROMPT = torch.tensor([[5, 17, 42, 9, 77, 3, 101]])
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def tiny_qwen(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).to(torch.bfloat16).eval()


def start(folder, model: torch.nn.Module | None = None, kept: int = 2) -> torch.nn.Module:
    """What loading does for an int8 model (loading.py): levels looked for before the engine's layers go in."""
    model = model if model is not None else tiny_qwen()
    return speed_up(model, on_gpu=False, quantize="int8", checks=CheckRecord(folder),
                    saved=saved_levels(folder, kept, model))


def scores(model: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=PROMPT).logits


def saved_folders(folder) -> list[str]:
    return sorted(path.name for path in (folder / FOLDER).iterdir())


def quantizing_counted(monkeypatch) -> list[tuple[int, ...]]:
    """The shapes of the model's weights `per_channel_int8` quantizes from now on. The kernels' self-tests at each
    start (internals.py) quantize a layer of their own, passed already by the start before: they are left out."""
    shapes: list[tuple[int, ...]] = []
    real = linear_int8.per_channel_int8
    monkeypatch.setattr(internals, "_kernel_fails", lambda layer_class, tolerance: None)

    def counted(weight: torch.Tensor, *args) -> tuple[torch.Tensor, torch.Tensor]:
        shapes.append(tuple(weight.shape))
        return real(weight, *args)

    monkeypatch.setattr(linear_int8, "per_channel_int8", counted)
    return shapes


def test_a_second_start_reads_the_saved_int8_weights_and_computes_the_same_scores(tmp_path, monkeypatch) -> None:
    first = start(tmp_path)
    [key] = saved_folders(tmp_path)
    assert (tmp_path / FOLDER / key / COMPLETE_MARK).is_file()
    quantized = quantizing_counted(monkeypatch)
    second = start(tmp_path)
    assert quantized == []  # every product's levels came from the folder
    assert torch.equal(scores(second), scores(first))
    layer = second.model.layers[0]
    assert type(layer.self_attn.qkv_proj.stacked) is Int8Linear and type(layer.mlp.gate_up_proj.stacked) is Int8Linear
    assert type(second.lm_head) is OutputInt8Linear
    assert saved_folders(tmp_path) == [key]
    # The int8 products compute over their saved bytes, mapped (no copy); the output layer over its mapped levels;
    # nothing else of the folder stays mapped (the scales are copies).
    gc.collect()
    folder = tmp_path / FOLDER / key
    products = {path.name for path in folder.glob(f"*{RAW_SUFFIX}")}
    assert len(products) == 2 * 4  # per layer: stacked q/k/v, o, stacked gate/up, down (the output layer: levels)
    assert mapped_names(folder) == products | {"lm_head.safetensors"}
    del second, layer
    gc.collect()
    assert mapped_names(folder) == set()  # let go with the model


def mapped_names(folder: Path) -> set[str]:
    """The names of the files of `folder` this process maps."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    return {Path(line.split()[-1]).name for line in lines if str(folder) in line}


def test_bytes_laid_out_for_another_cpu_are_never_read(tmp_path, monkeypatch) -> None:
    """A folder saved where oneDNN lays int8 weights out otherwise (another CPU, another torch) has another key:
    its bytes, read in this layout, would compute garbage."""
    start(tmp_path)
    monkeypatch.setattr(internals, "int8_layout", lambda: "another-cpu")
    quantized = quantizing_counted(monkeypatch)
    start(tmp_path)
    assert len(quantized) == 2 * 4 + 1 and len(saved_folders(tmp_path)) == 2


def test_where_saved_bytes_cannot_be_built_on_levels_are_saved_and_laid_out_at_each_start(tmp_path,
                                                                                           monkeypatch) -> None:
    monkeypatch.setattr(internals, "int8_layout", lambda: None)
    first = start(tmp_path)
    [key] = saved_folders(tmp_path)
    assert list((tmp_path / FOLDER / key).glob(f"*{RAW_SUFFIX}")) == []
    quantized = quantizing_counted(monkeypatch)
    second = start(tmp_path)
    assert quantized == [] and torch.equal(scores(second), scores(first))
    assert all(layer.packed_memory is None for layer in second.modules() if isinstance(layer, Int8Linear))


def test_the_layout_check_rebuilds_a_weight_over_its_bytes_and_computes_the_same() -> None:
    """internals.int8_layout on this machine: oneDNN's bytes of a packed weight, copied and built on again, give
    its products; the hash names the layout (the same in one process)."""
    layout = internals.int8_layout()
    assert layout is not None and len(layout) == 16
    weight = torch.nn.Linear(96, 40, bias=False, dtype=torch.bfloat16)
    layer = Int8Linear(weight)
    saved = layer.packed_bytes()
    rebuilt = Int8Linear(weight, PackedBytes(saved.raw.clone(), saved.layout, saved.scales))
    rows = torch.randn(3, 96, dtype=torch.bfloat16)
    assert torch.equal(rebuilt(rows), layer(rows))
    other = Int8Linear(torch.nn.Linear(96, 40, bias=False, dtype=torch.bfloat16))
    assert not torch.equal(other(rows), layer(rows))  # the comparison can fail


def test_a_changed_model_is_quantized_anew_and_saved_beside_the_first(tmp_path, monkeypatch) -> None:
    start(tmp_path)
    tuned = tiny_qwen()
    with torch.no_grad():  # as a fine-tune changes every weight a little
        for parameter in tuned.parameters():
            parameter.add_(torch.randn_like(parameter) * 1e-2)
    expected = scores(speed_up(tiny_qwen_like(tuned), on_gpu=False, quantize="int8"))
    quantized = quantizing_counted(monkeypatch)
    model = start(tmp_path, tuned)
    assert len(quantized) == 2 * 4 + 1  # per layer: stacked q/k/v, o, stacked gate/up, down; and the output layer
    assert torch.equal(scores(model), expected)
    assert len(saved_folders(tmp_path)) == 2


def tiny_qwen_like(model: torch.nn.Module) -> torch.nn.Module:
    copy = tiny_qwen()
    copy.load_state_dict(model.state_dict())
    return copy


def test_only_the_most_recently_used_models_stay_saved(tmp_path, monkeypatch) -> None:
    start(tmp_path, tiny_qwen(seed=0), kept=1)
    start(tmp_path, tiny_qwen(seed=1), kept=1)
    [second] = saved_folders(tmp_path)
    quantized = quantizing_counted(monkeypatch)
    start(tmp_path, tiny_qwen(seed=1), kept=1)
    assert quantized == [] and saved_folders(tmp_path) == [second]
    start(tmp_path, tiny_qwen(seed=0), kept=1)  # gone: quantized and saved again, in the other's place
    assert quantized and len(saved_folders(tmp_path)) == 1 and saved_folders(tmp_path) != [second]


def test_a_damaged_saved_weight_is_quantized_again_with_one_line(tmp_path, monkeypatch, caplog) -> None:
    expected = scores(start(tmp_path))
    [key] = saved_folders(tmp_path)
    (tmp_path / FOLDER / key / "model.layers.1.mlp.down_proj.safetensors").write_bytes(b"\x00" * 40)
    quantized = quantizing_counted(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="agent.llm.engine"):
        model = start(tmp_path)
    assert quantized == [(64, 128)]  # that one layer only
    assert torch.equal(scores(model), expected)
    assert [record.getMessage().split(" (")[0] for record in caplog.records] == [
        f"int8 levels of model.layers.1.mlp.down_proj unreadable in {tmp_path / FOLDER / key}",
        f"removed the damaged int8 weights in {tmp_path / FOLDER / key}: the next start saves them anew"]
    assert torch.equal(scores(model), expected)  # its products mapped from the removed files still compute
    quantized.clear()
    start(tmp_path)  # saves them anew
    assert len(quantized) == 2 * 4 + 1 and saved_folders(tmp_path) == [key]
    quantized.clear()
    assert torch.equal(scores(start(tmp_path)), expected) and quantized == []


def test_a_damaged_laid_out_weight_is_quantized_again_with_one_line(tmp_path, monkeypatch, caplog) -> None:
    expected = scores(start(tmp_path))
    [key] = saved_folders(tmp_path)
    raw = tmp_path / FOLDER / key / f"model.layers.0.mlp.down_proj{RAW_SUFFIX}"
    raw.write_bytes(raw.read_bytes()[:100])  # cut short
    quantized = quantizing_counted(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="agent.llm.engine"):
        model = start(tmp_path)
    assert quantized == [(64, 128)]
    assert torch.equal(scores(model), expected)
    assert [record.getMessage().split(" (")[0] for record in caplog.records] == [
        f"int8 levels of model.layers.0.mlp.down_proj unreadable in {tmp_path / FOLDER / key}",
        f"removed the damaged int8 weights in {tmp_path / FOLDER / key}: the next start saves them anew"]


def test_an_interrupted_save_is_never_read_and_is_cleared_by_the_next(tmp_path, monkeypatch) -> None:
    crashed = tmp_path / FOLDER / "0123456789abcdef.99999.partial"
    running = tmp_path / FOLDER / "fedcba9876543210.99998.partial"  # another process saving right now
    for partial in (crashed, running):
        partial.mkdir(parents=True)
        (partial / "lm_head.safetensors").write_bytes(b"half a file")
    hours_ago = time.time() - 2 * STALE_SECONDS
    os.utime(crashed, (hours_ago, hours_ago))
    quantized = quantizing_counted(monkeypatch)
    start(tmp_path)
    assert len(quantized) == 2 * 4 + 1 and not crashed.exists() and running.exists()
    assert len(saved_folders(tmp_path)) == 2  # the new complete folder, and the save still running


def test_a_save_whose_folder_was_cleared_meanwhile_is_not_put_in_place(tmp_path, caplog) -> None:
    saved = SavedLevels(tmp_path, "key", kept=2)
    levels = torch.zeros(4, 8, dtype=torch.int8), torch.ones(4)
    saved.put("first", levels)
    shutil.rmtree(tmp_path / f"key.{os.getpid()}.partial")  # as another process clearing what it took as stale
    with caplog.at_level(logging.WARNING, logger="agent.llm.engine"):
        saved.put("second", levels)
        saved.finish()
    assert list(tmp_path.iterdir()) == []
    assert [record.getMessage().startswith("could not save int8 levels") for record in caplog.records] == [True]
    assert SavedLevels(tmp_path, "key", kept=2).get("second", 4, 8) is None


def test_a_folder_that_cannot_be_written_costs_only_the_saving(tmp_path, monkeypatch, caplog) -> None:
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    expected = scores(speed_up(tiny_qwen(), on_gpu=False, quantize="int8"))
    with caplog.at_level(logging.WARNING, logger="agent.llm.engine"):
        model = start(blocked)
    assert torch.equal(scores(model), expected)
    assert [record.getMessage().startswith("could not save int8 levels") for record in caplog.records] == [True]


def test_none_are_saved_with_a_kept_count_of_zero(tmp_path) -> None:
    assert saved_levels(tmp_path, 0, tiny_qwen()) is None
    assert saved_levels(None, 2, tiny_qwen()) is None


@real_model_test
async def test_the_real_model_answers_the_same_from_the_int8_weights_its_first_start_saved(tmp_path) -> None:
    """Two starts of the test model in int8 sharing MODEL_CONVERTED_DIR, as two runs of the bot: the first converts
    the GGUF, checks the engine and saves the int8 weights; the second reads them, and answers token for token."""
    lines: list[str] = []
    answers = []
    with worker_log_watched(lines.append):
        for _ in range(2):
            llm = await started_local_llm(dtype="int8", converted_dir=tmp_path)
            try:
                answers.append((await llm.complete(ModelRequest(FRANCE, max_new_tokens=16))).text)
            finally:
                await llm.close()
    assert sum(line.startswith("saved the int8 weights") for line in lines) == 1, lines
    assert answers[0] and answers[1] == answers[0]
