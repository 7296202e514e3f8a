"""The model file's pages let go after loading (engine/file_pages.py): on a real safetensors file mapped as
transformers maps it (safetensors' `safe_open`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from agent.llm.engine.file_pages import release_file_pages, weight_file_mappings

SMAPS = Path("/proc/self/smaps")
pytestmark = pytest.mark.skipif(not SMAPS.exists(), reason="Linux's /proc/self/smaps: file_pages does nothing elsewhere")


def mapped_weight(tmp_path: Path, name: str) -> tuple[torch.Tensor, Path]:
    """A 16 MiB tensor read from a safetensors file through its mapping, every page read once (resident)."""
    path = tmp_path / f"{name}.safetensors"
    save_file({"weight": torch.arange(4 << 20, dtype=torch.float32)}, str(path))
    with safe_open(str(path), "pt") as file:
        weight = file.get_tensor("weight")
    assert torch.equal(weight, torch.arange(4 << 20, dtype=torch.float32))
    return weight, path


def mapping_of(path: Path):
    found = [mapping for mapping in weight_file_mappings(SMAPS.read_text()) if mapping.path == str(path)]
    assert len(found) == 1
    return found[0]


def test_read_pages_are_released_and_come_back_when_read_again(tmp_path: Path) -> None:
    weight, path = mapped_weight(tmp_path, "read")
    assert mapping_of(path).resident_kb >= 16 << 10
    assert release_file_pages() >= 16 << 20
    assert mapping_of(path).resident_kb < 1 << 10  # nothing of it counted in the process's memory any more
    assert torch.equal(weight[:1024], torch.arange(1024, dtype=torch.float32))  # read again: the file's, page by page
    assert 0 < mapping_of(path).resident_kb < 1 << 10


def test_a_mapping_the_process_wrote_is_kept_with_its_writes(tmp_path: Path) -> None:
    weight, path = mapped_weight(tmp_path, "written")
    weight[0] = -7.0  # a private copy of one page: dropping it would undo the write
    assert mapping_of(path).written_kb > 0
    release_file_pages()
    assert mapping_of(path).resident_kb >= 16 << 10
    assert float(weight[0]) == -7.0 and float(weight[1]) == 1.0
