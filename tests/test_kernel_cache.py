"""oneDNN's kernel cache bounded (engine/kernel_cache.py): products of many row counts, each a shape oneDNN compiles
a kernel for, leave a fresh process's memory where a bounded cache keeps it, not growing by every shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: oneDNN reads its capacity once, when it first compiles a kernel.
PROBE = """
import ctypes, gc, json, sys
from agent.llm.engine import kernel_cache
kernel_cache.limit(int(sys.argv[1]))
import torch
from agent.llm.engine.linear_int8 import Int8Linear

def resident_mib():
    gc.collect(); ctypes.CDLL("libc.so.6").malloc_trim(0)
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

torch.manual_seed(0)
layers = [Int8Linear(torch.nn.Linear(1024, width, bias=False)) for width in (1024, 2048, 3072)]
for layer in layers:
    layer(torch.randn(3, 1024))
before = resident_mib()
with torch.inference_mode():
    for rows in range(20, 170):  # a prompt length each: a new shape for every layer
        for layer in layers:
            layer(torch.randn(rows, 1024))
print(json.dumps({"growth_mib": resident_mib() - before}))
"""


def growth_mib(entries: int) -> float:
    env = {key: value for key, value in os.environ.items() if key != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    done = subprocess.run([sys.executable, "-c", PROBE, str(entries)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["growth_mib"]


@pytest.mark.skipif(not Path("/proc/self/statm").exists() or sys.platform != "linux", reason="reads Linux's /proc")
def test_a_bounded_kernel_cache_keeps_memory_flat_over_many_prompt_lengths() -> None:
    unbounded, bounded = growth_mib(1024), growth_mib(8)
    assert unbounded > 30  # oneDNN's own default keeps a kernel for each of the 450 shapes
    assert bounded < unbounded / 3
