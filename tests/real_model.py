"""The offline test model (SmolLM2-135M GGUF) for the tests that run it: where it is, and how such a test runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.llm.local import LocalLLM

GGUF = Path(__file__).resolve().parents[1] / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def real_model_test(test):
    """Mark a test as using the real model, on the module's event loop (where the shared model was started)."""
    return pytest.mark.real_model(pytest.mark.asyncio(loop_scope="module")(test))


async def started_local_llm(**options) -> LocalLLM:
    """`LocalLLM` on the test model, started (on CPU, batches of 8, unless `options` say otherwise)."""
    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is missing: run scripts/fetch_assets.sh (scripts/test.sh does)")
    backend = LocalLLM(str(GGUF), **{"device_map": "cpu", "batch_size": 8, **options})
    await backend.start()
    return backend
