"""The offline speech model (whisper-base, CTranslate2) and the test recordings, for the tests that transcribe
for real: where they are, and how such a test is marked."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WHISPER = ROOT / ".cache" / "models" / "whisper-base"  # scripts/fetch_assets.sh puts it there
RECORDINGS = ROOT / "tests" / "data"  # made as tests/data/README.md says
QUESTION_EN = "How many lessons does the machine learning course have?"


def real_asr_test(test):
    """Mark a test as transcribing with the real whisper-base weights."""
    return pytest.mark.real_asr(test)


def whisper_folder() -> Path:
    """The whisper-base folder; the test fails (never skips) when it is missing."""
    if not (WHISPER / "model.bin").is_file():
        pytest.fail(f"{WHISPER} is missing: run scripts/fetch_assets.sh (scripts/test.sh does)")
    return WHISPER


def recording(name: str) -> bytes:
    """A test recording's bytes (question_en.ogg, question_zh.ogg)."""
    return (RECORDINGS / name).read_bytes()
