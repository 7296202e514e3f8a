"""Hub ids with no hub: a cached model loads without a request; an uncached one fails fast, in one line.

The "hub" here is a closed port on 127.0.0.1 (HF_ENDPOINT), so any request that slipped through would fail, and
nothing leaves the machine. The cached model is a tiny random Llama with SmolLM2's tokenizer (ChatML), written in
the Hugging Face cache layout, as a download would have left it.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agent.llm.engine.hub import ALTERNATIVES
from bot.program.config import Settings

ROOT = Path(__file__).resolve().parent.parent
GGUF = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SETTING_NAMES = set(Settings.variables())
REPO_ID = "tiny-org/tiny-chat"
SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def qwenbot_ask(tmp_path: Path, model: str, **settings: str) -> subprocess.CompletedProcess:
    """`qwenbot ask` on the local backend with the hub at a closed loopback port."""
    clean = {k: v for k, v in os.environ.items() if k not in SETTING_NAMES and not k.startswith("HF_")}
    env = {**clean, "PYTHONPATH": str(ROOT), "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}",
           "DATA_DIR": str(tmp_path), "LLM_BACKEND": "local", "MODEL": model, "MODEL_DEVICE_MAP": "cpu",
           "MAX_STEPS": "1", "MAX_NEW_TOKENS": "4", "LOG_LEVEL": "WARNING", **settings}
    return subprocess.run([sys.executable, "-m", "bot.program.cli", "ask", "hello"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_an_uncached_hub_id_with_no_hub_fails_at_once_with_the_alternatives(tmp_path):
    done = qwenbot_ask(tmp_path, "Qwen/Qwen2.5-1.5B-Instruct")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()  # one line: none of the hub's own retry warnings
    assert line.startswith(f"qwenbot: MODEL Qwen/Qwen2.5-1.5B-Instruct: not in the model cache ({tmp_path / 'models'})"
                           " and the hub at http://127.0.0.1:")
    assert line.endswith(f"cannot be reached (ConnectError); use {ALTERNATIVES}")
    assert "LLM_BACKEND=openai" in line and ".gguf" in line


def test_hf_hub_offline_is_named_as_the_reason(tmp_path):
    done = qwenbot_ask(tmp_path, "Qwen/Qwen2.5-1.5B-Instruct", HF_HUB_OFFLINE="1")
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1, done.stderr  # none of the hub's own retry warnings
    assert "and HF_HUB_OFFLINE is set; use a local folder" in done.stderr


@pytest.fixture(scope="module")
def cached_hub_model(tmp_path_factory) -> Path:
    """A data dir whose model cache holds REPO_ID (tiny random weights, a real chat tokenizer)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is missing: run scripts/fetch_assets.sh (scripts/test.sh does)")
    data_dir = tmp_path_factory.mktemp("data")
    repo = data_dir / "models" / f"models--{REPO_ID.replace('/', '--')}"
    snapshot = repo / "snapshots" / SNAPSHOT
    tokenizer = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    tokenizer.save_pretrained(snapshot)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SNAPSHOT)
    return data_dir


@pytest.mark.real_model
def test_a_cached_hub_id_loads_and_answers_without_the_hub(cached_hub_model):
    done = qwenbot_ask(cached_hub_model, REPO_ID, LOG_LEVEL="INFO")
    assert done.returncode == 0, done.stderr
    assert "built by the engine" in done.stderr  # from the cached snapshot (own_model.py), hub or not
    with sqlite3.connect(cached_hub_model / "bot.sqlite3") as db:
        (answer, model_calls), = db.execute("SELECT answer, model_calls FROM turns").fetchall()
    assert answer == done.stdout.strip() and model_calls >= 1
