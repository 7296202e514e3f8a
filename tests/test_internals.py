"""The guard around library internals (agent/llm/engine/internals.py): the private names live there only, and where
a check at load fails the engine answers through transformers' own forward and cache, with the same tokens and one
log line. Nothing is installed or downgraded: a changed library is played by taking one checked internal away."""

from __future__ import annotations

import logging
import re
import subprocess
from pathlib import Path

import pytest
import pytest_asyncio
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agent.llm.base import ModelRequest
from agent.llm.engine import forward_pass, internals, own_model
from agent.llm.engine.check_record import RECORD_FILE, CheckRecord
from agent.llm.engine.linear_bf16 import PackedLinear, pack_linears
from agent.llm.engine.weights import speed_up
from tests.real_model import real_model_test, started_local_llm, worker_log_watched

REPO = Path(__file__).resolve().parents[1]
# The private names the engine uses, spelled in pieces so that this file is not among the places they are found.
NAMES = ["_attn" "_implementation", "_hf" "_hook", "_forward" "_hooks", "ddp_cache" "_data", "lazy" "_initialization",
         "mkldnn" "._"]
# Named by issue 36 and no longer used at all: int8 weights go through oneDNN's qlinear prepack (issue 37), not a
# quantized module's packed parameters. It must stay out of the code outside the guard module all the same.
GONE = ["_packed" "_params"]
PRIVATE = "|".join(re.escape(name) for name in NAMES + GONE)
FALLBACK_LINE = "the engine's fast path is off, running on transformers' own forward and cache"
CALLS = [dict(messages=[{"role": "user", "content": "What is the capital of France?"}], max_new_tokens=16),
         dict(messages=[{"role": "user", "content": "Write a haiku about the sea."}], max_new_tokens=24)]


def test_every_private_name_of_transformers_and_torch_is_in_the_guard_module_only() -> None:
    found = subprocess.run(["git", "grep", "-nE", PRIVATE], cwd=REPO, capture_output=True, text=True).stdout
    places = {line.split(":", 1)[0] for line in found.splitlines()}
    assert places == {"agent/llm/engine/internals.py"}
    for name in NAMES:
        assert name in found, name  # each is named there (the table in its docstring at least)


def tiny_llama(layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=layers,
                                        num_attention_heads=6, num_key_value_heads=2)).to(torch.bfloat16).eval()


def test_a_bf16_model_keeps_plain_linear_layers_when_the_packed_kernel_is_gone(monkeypatch, caplog) -> None:
    model = tiny_llama()

    def gone(weight: torch.Tensor) -> torch.Tensor:
        raise AttributeError("'_OpNamespace' 'mkldnn' object has no attribute '_reorder_linear_weight'")

    monkeypatch.setattr(internals, "pack_bf16_weight", gone)
    with caplog.at_level(logging.INFO, logger="agent.llm.engine"):
        assert pack_linears(model) == 0
    assert not any(isinstance(module, PackedLinear) for module in model.modules())
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["bf16 linear layers stay as they are: AttributeError: '_OpNamespace' 'mkldnn' object has no "
                     "attribute '_reorder_linear_weight'"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """One converted copy of the test model for every start in this module."""
    return tmp_path_factory.mktemp("converted")


class PassCounter:
    """Counts the steps that went through the engine's own decode pass (forward_pass.py) rather than the model's
    forward, and computes them as it would."""

    def __init__(self) -> None:
        self.calls = 0
        self.real = forward_pass.decode_pass

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


async def generated(converted: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], int, list[str]]:
    """Start the model (fp32, exact), answer `CALLS` one after the other; the replies, how many steps took the
    engine's own pass, and the fallback lines logged from the start on. Each start stands for other library
    versions, so the record of earlier starts' passed checks (check_record.py) is removed first."""
    (converted / RECORD_FILE).unlink(missing_ok=True)
    # transformers' model classes: the fallback is to their forward (the engine's own models: test_own_model.py)
    monkeypatch.setattr(own_model, "buildable", lambda folder: "transformers' classes, for this test")
    counter, logged = PassCounter(), []
    with worker_log_watched(logged.append):
        llm = await started_local_llm(converted_dir=converted)
        monkeypatch.setattr(forward_pass, "decode_pass", counter)  # after the load's own checks
        try:
            replies = [(await llm.complete(ModelRequest(**call))).text for call in CALLS]
        finally:
            await llm.close()
    return replies, counter.calls, [line for line in logged if FALLBACK_LINE in line]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def checked(converted):
    """The replies with every check holding, how many steps took the engine's own pass, the fallback lines."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        return await generated(converted, monkeypatch)


@real_model_test
async def test_with_every_check_holding_the_engine_runs_its_own_pass_and_logs_no_fallback(checked) -> None:
    replies, own_passes, fallbacks = checked
    assert all(replies) and own_passes > 0
    assert fallbacks == []


@real_model_test
async def test_a_torch_without_the_hook_registries_answers_through_transformers_forward(
        checked, converted, monkeypatch) -> None:
    def renamed(module) -> bool:
        raise AttributeError(f"'{type(module).__name__}' object has no attribute '{NAMES[2]}'")

    monkeypatch.setattr(internals, "has_hooks", renamed)  # as a torch that renamed its hook registries
    replies, own_passes, fallbacks = await generated(converted, monkeypatch)
    assert replies == checked[0]
    assert own_passes == 0
    assert fallbacks == [
        f"{FALLBACK_LINE}: AttributeError: 'LlamaForCausalLM' object has no attribute '{NAMES[2]}'"]


@real_model_test
async def test_a_decode_pass_that_no_longer_mirrors_the_forward_is_caught_at_load(
        checked, converted, monkeypatch) -> None:
    def other_rotation(heads, rotation):  # as a transformers whose rotary embedding changed its convention
        cos, signed_sin = rotation
        return heads * cos - heads.roll(heads.shape[-1] // 2, dims=-1) * signed_sin

    monkeypatch.setattr(forward_pass, "_rotate", other_rotation)
    replies, own_passes, fallbacks = await generated(converted, monkeypatch)
    assert replies == checked[0]
    assert own_passes == 0
    assert fallbacks == [
        f"{FALLBACK_LINE}: the decode pass (forward_pass.py) does not give the model's forward's scores"]


def test_checks_passed_once_are_skipped_until_what_they_depend_on_changes(tmp_path, monkeypatch) -> None:
    """The checks that run the model are recorded once passed (check_record.py): the next start of the same model
    with the same libraries skips them; another torch version, or another model, is checked again."""
    checked = []
    real = internals.cache_mismatch
    monkeypatch.setattr(internals, "cache_mismatch", lambda model: checked.append(model) or real(model))
    record = CheckRecord(tmp_path)
    for _ in range(2):
        assert internals.on_checked_path(speed_up(tiny_llama(), on_gpu=False, checks=record))
    assert len(checked) == 1
    speed_up(tiny_llama(layers=3), on_gpu=False, checks=record)
    monkeypatch.setattr(torch, "__version__", "99.0.0")  # as after an upgrade
    speed_up(tiny_llama(), on_gpu=False, checks=record)
    assert len(checked) == 3


def test_a_failed_check_is_never_recorded_and_says_why_at_every_start(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(internals, "pass_mismatch", lambda model: "the decode pass no longer mirrors the forward")
    record = CheckRecord(tmp_path)
    with caplog.at_level(logging.WARNING, logger="agent.llm.engine"):
        for _ in range(2):
            assert not internals.on_checked_path(speed_up(tiny_llama(), on_gpu=False, checks=record))
    assert [record.getMessage() for record in caplog.records] == [
        f"{FALLBACK_LINE}: the decode pass no longer mirrors the forward"] * 2


def test_an_unreadable_or_unwritable_record_only_means_checking_again(tmp_path) -> None:
    (tmp_path / RECORD_FILE).write_text("{not json")
    record = CheckRecord(tmp_path)
    assert not record.passed("a fingerprint")
    record.remember("a fingerprint")
    assert record.passed("a fingerprint") and CheckRecord(tmp_path).passed("a fingerprint")
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    CheckRecord(blocked).remember("a fingerprint")  # no error: the next start checks again
    assert not CheckRecord(blocked).passed("a fingerprint")
