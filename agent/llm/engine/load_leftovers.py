"""Handing back the memory loading leaves behind: the model file's pages, and the heap's freed blocks.

The model file. transformers maps a safetensors file into memory and hands out tensors over that mapping. The
engine then lays most weights out anew (packed bf16, int8, int4: weights.py), yet the mapping stays, and every page
loading read stays resident and counted in the process's memory although nothing reads it again: at the 0.5B shape
785 MB of a 2.3 GB total (bench/README.md § Memory). `release_file_pages` tells the kernel (madvise MADV_DONTNEED)
that the process no longer needs those pages; what is still read through the mapping (the embedding's rows of the
tokens seen, the norms) comes back a page at a time from the page cache, as with llama.cpp's own mapping of a GGUF
file. Only a mapping none of whose pages the process wrote is released (smaps' `Anonymous: 0 kB`): dropping a
written page of a private mapping would undo the write.

The heap. Stacking and quantizing free the loaded copies of the weights, but glibc keeps freed blocks of that size
in its heap rather than returning them (its mmap threshold rises with every large block freed), so the process
still counted them: another 570 MB at the 0.5B shape. `trim_heap` (glibc's malloc_trim) returns the free pages.
That rise also kept a prompt's activations (megabytes each) on the heap; a start that frees no large block (int8
products built over their saved bytes: saved_int8.py) left the threshold at 128 KB, and every activation was a
fresh mapping, faulted in page by page: 268,000 faults, 0.3 s, in each 300-token prompt at the 1.5B shape.
`heap_for_activations` sets the thresholds glibc would have risen to.

Linux with glibc only; elsewhere nothing happens.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MADV_DONTNEED = 4  # Linux's value on every architecture torch runs on
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
ACTIVATIONS_ON_HEAP = 32 << 20  # glibc's own ceiling for its rising mmap threshold (64-bit); trimmed above twice it
_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s+(.*)$")
_FIELD = re.compile(r"^(\w+):\s+(\d+) kB")


@dataclass(frozen=True)
class FileMapping:
    """One mapping of a file into this process, as /proc/self/smaps describes it."""

    start: int
    end: int
    path: str
    resident_kb: int
    written_kb: int  # pages the process wrote (copies of its own): such a mapping is never released

    @property
    def releasable(self) -> bool:
        return self.written_kb == 0 and self.resident_kb > 0


def weight_file_mappings(smaps: str, suffix: str = ".safetensors") -> list[FileMapping]:
    """The mappings of files whose name ends with `suffix`, from the text of /proc/PID/smaps."""
    found: list[FileMapping] = []
    current: dict | None = None
    for line in smaps.splitlines():
        header = _HEADER.match(line)
        if header:
            current = None
            if header.group(3).endswith(suffix):
                current = {"start": int(header.group(1), 16), "end": int(header.group(2), 16),
                           "path": header.group(3), "Rss": 0, "Anonymous": 0}
                found.append(current)  # type: ignore[arg-type]
            continue
        field = _FIELD.match(line)
        if current is not None and field and field.group(1) in ("Rss", "Anonymous"):
            current[field.group(1)] = int(field.group(2))
    return [FileMapping(m["start"], m["end"], m["path"], m["Rss"], m["Anonymous"]) for m in found]  # type: ignore


class LoadLeftovers:
    """Hands back the file's pages and the heap's free blocks each time it is called: between the layers the engine
    lays out (weights.py) and once at the end, so that loading holds about one layer's copies at a time rather than
    every page of the file and every stacked copy at once (at the 1.5B shape, int8: 3.9 GB instead of 6.7).

    The file's mappings are read, and checked unwritten, once, when from_pretrained is done; the engine's layers
    never write into the loaded weights (they make new tensors), so they stay unwritten."""

    def __init__(self, smaps_path: Path = Path("/proc/self/smaps")):
        try:
            self._mappings = [mapping for mapping in weight_file_mappings(smaps_path.read_text())
                              if mapping.written_kb == 0]
        except OSError:
            self._mappings = []

    def __call__(self) -> None:
        for mapping in self._mappings:
            _dont_need(mapping)
        _malloc_trim()

    @staticmethod
    def resident() -> tuple[int, int]:
        """This process's resident memory now and at its peak, in bytes (0 where /proc is not there)."""
        return _resident("VmRSS"), _resident("VmHWM")


def trim_heap() -> int:
    """Return the heap's free pages to the system (glibc's malloc_trim); the bytes it gave back."""
    before = _resident("RssAnon")
    _malloc_trim()
    return max(before - _resident("RssAnon"), 0)


def heap_for_activations() -> None:
    """Serve blocks up to 32 MB from the heap and keep up to 64 MB of it free (glibc's mallopt), as glibc itself
    does once a block that large was freed: a prompt's activations then reuse the heap's pages."""
    mallopt = getattr(_libc(), "mallopt", None)  # glibc only
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, ACTIVATIONS_ON_HEAP)
        mallopt(M_TRIM_THRESHOLD, 2 * ACTIVATIONS_ON_HEAP)


def release_file_pages(smaps_path: Path = Path("/proc/self/smaps")) -> int:
    """Drop the resident pages of this process's unwritten safetensors mappings; returns the bytes released."""
    try:
        mappings = weight_file_mappings(smaps_path.read_text())
    except OSError:
        return 0
    return sum(mapping.resident_kb << 10 for mapping in mappings if mapping.releasable and _dont_need(mapping))


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, opened once (it is asked after every layer while loading and whenever the engine idles)."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _dont_need(mapping: FileMapping) -> bool:
    libc = _libc()
    if libc is None:
        return False
    if libc.madvise(ctypes.c_void_p(mapping.start), ctypes.c_size_t(mapping.end - mapping.start), MADV_DONTNEED):
        log.info("could not release %s's pages: errno %d", mapping.path, ctypes.get_errno())
        return False
    return True


def _malloc_trim() -> None:
    trim = getattr(_libc(), "malloc_trim", None)  # glibc only
    if trim is not None:
        trim(0)


def _resident(field: str) -> int:
    """This process's resident memory of one kind (/proc/self/status: VmRSS, RssAnon), in bytes; 0 elsewhere."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0
    found = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) << 10 if found else 0
