"""The offline test model (SmolLM2-135M GGUF) for the tests that run it: where it is, and how such a test runs."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest

from agent.llm.local import LocalLLM

GGUF = Path(__file__).resolve().parents[1] / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
# Where `started_local_llm` puts the model: cpu, or (bench/gpu_check.sh) cuda on a GPU machine.
DEVICE_MAP = os.environ.get("QWENBOT_TEST_DEVICE_MAP", "cpu")


def real_model_test(test):
    """Mark a test as using the real model, on the module's event loop (where the shared model was started)."""
    return pytest.mark.real_model(pytest.mark.asyncio(loop_scope="module")(test))


async def started_local_llm(**options) -> LocalLLM:
    """`LocalLLM` on the test model, started (on CPU, fp32, batches of 8, unless `options` say otherwise).

    fp32, not `auto`: on a CPU with bf16 `auto` is bf16, whose rounding lets a row's tokens differ between a batch
    and a run alone, and these tests compare exactly that (the issue's "token for token, same dtype")."""
    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is missing: run scripts/fetch_assets.sh (scripts/test.sh does)")
    backend = LocalLLM(str(GGUF), **{"device_map": DEVICE_MAP, "dtype": "float32", "batch_size": 8, **options})
    await backend.start()
    return backend


@contextmanager
def worker_log_watched(on_message: Callable[[str], None]) -> Iterator[None]:
    """Call `on_message` with every message the model thread logs meanwhile, DEBUG ones included (it logs each
    batch it starts: "generating a batch of N ...", then "batch of N: reused ..., computed K columns")."""
    class Watcher(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            on_message(record.getMessage())

    worker_log, watcher = logging.getLogger("agent.llm"), Watcher()
    level = worker_log.level
    worker_log.addHandler(watcher)
    worker_log.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        worker_log.removeHandler(watcher)
        worker_log.setLevel(level)
