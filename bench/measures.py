"""Small measuring tools for the benchmarks: percentiles, a process's peak memory, the event loop's lag."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from pathlib import Path
from typing import Any, Sequence


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile of `values` (None for none)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))]


def median(values: Sequence[float | None]) -> float | None:
    """The median of the known values (the mean of the middle two for an even count); None if none is known."""
    known = sorted(v for v in values if v is not None)
    if not known:
        return None
    middle = len(known) // 2
    return known[middle] if len(known) % 2 else (known[middle - 1] + known[middle]) / 2


class PeakMemory:
    """The peak resident memory (Linux's VmHWM) of one process, from a point on.

    Writing 5 to /proc/PID/clear_refs resets the high-water mark to the current RSS (Linux 4.0+), so each measured
    row gets its own peak rather than the process's lifetime one. Where that is not allowed, the peak is the
    lifetime one (`reset_works` says which).
    """

    def __init__(self, pid: int | str = "self"):
        self.pid = pid
        self.reset_works = True

    def reset(self) -> None:
        """Start a new peak from the current RSS."""
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        except OSError:
            self.reset_works = False

    def peak_mb(self) -> float | None:
        """The peak RSS since the last reset, in MiB (None if the process cannot be read)."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
        return int(found.group(1)) / 1024 if found else None


class GpuPeak:
    """Peak GPU memory allocated by torch in this process, from a point on (None without CUDA)."""

    def __init__(self) -> None:
        import torch

        self._cuda = torch.cuda if torch.cuda.is_available() else None

    def reset(self) -> None:
        """Start a new peak."""
        if self._cuda:
            self._cuda.reset_peak_memory_stats()

    def peak_mb(self) -> float | None:
        """The peak since the last reset, in MiB."""
        return self._cuda.max_memory_allocated() / 2**20 if self._cuda else None


class LagMeter:
    """A ticker coroutine every 10 ms; records how late each tick wakes up (the event loop's lag)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "LagMeter":
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            self.lags.append(time.perf_counter() - before - 0.01)

    def p99_ms(self) -> float | None:
        """The 99th percentile lag in milliseconds."""
        lag = percentile(self.lags, 0.99)
        return None if lag is None else lag * 1000
