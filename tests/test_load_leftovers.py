"""What loading leaves behind, handed back (engine/load_leftovers.py): the pages of a real safetensors file mapped
as transformers maps it (safetensors' `safe_open`), and freed heap blocks."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from agent.llm.engine.load_leftovers import LoadLeftovers, release_file_pages, trim_heap, weight_file_mappings

SMAPS = Path("/proc/self/smaps")
pytestmark = pytest.mark.skipif(not SMAPS.exists(), reason="Linux's /proc/self/smaps: nothing is released elsewhere")


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


def test_freed_blocks_of_the_heap_are_given_back() -> None:
    """Blocks freed after a larger block was freed stay in glibc's heap (its mmap threshold rose to that size),
    counted in the process's memory until trimmed; the last block keeps the heap's top in use, so glibc does not
    trim it on its own."""
    torch.empty(24 << 20, dtype=torch.uint8).fill_(1)  # mapped, then freed: the threshold rises to 24 MiB
    blocks = [torch.empty(8 << 20, dtype=torch.uint8).fill_(1) for _ in range(16)]  # 128 MiB from the heap
    del blocks[:-1]
    assert trim_heap() >= 64 << 20
    assert int(blocks[0].sum()) == 8 << 20  # the block in use is untouched


def test_loading_hands_the_files_pages_back_each_time_a_layer_is_laid_out(tmp_path: Path) -> None:
    weight, path = mapped_weight(tmp_path, "layers")
    leftovers = LoadLeftovers()  # after from_pretrained: the mapping is there, unwritten
    leftovers()
    assert mapping_of(path).resident_kb < 1 << 10
    assert torch.equal(weight, torch.arange(4 << 20, dtype=torch.float32))  # a later layer reads the file again
    assert mapping_of(path).resident_kb >= 16 << 10
    leftovers()
    assert mapping_of(path).resident_kb < 1 << 10
    now, peak = LoadLeftovers.resident()
    assert 0 < now <= peak




ACTIVATION = """
import ctypes, sys
import torch
from agent.llm.engine.load_leftovers import heap_for_activations

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "set":
    heap_for_activations()
before = libc.mallinfo2().hblkhd
activation = torch.empty(20 << 20, dtype=torch.uint8)
print(libc.mallinfo2().hblkhd - before)
"""


def mapped_for_an_activation(setting: str) -> int:
    """The bytes glibc maps apart from its heap for a 20 MiB activation, in a fresh process (mallinfo2's hblkhd)."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", ACTIVATION, setting], capture_output=True, text=True, check=True)
    return int(run.stdout)


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="glibc 2.33's mallinfo2: glibc only")
def test_after_loading_sets_the_heap_up_activations_come_from_the_heap() -> None:
    """A start that frees no large block (int8 products over saved bytes) kept glibc's 128 KB mmap threshold: each
    of a prompt's activations was a fresh mapping, faulted in page by page and unmapped when freed (268,000 faults
    in a 300-token prompt at the 1.5B shape); with `heap_for_activations` they come from the heap, whose pages are
    reused."""
    assert mapped_for_an_activation("set") == 0
    assert mapped_for_an_activation("unset") >= 20 << 20  # glibc's defaults: what it prevents
