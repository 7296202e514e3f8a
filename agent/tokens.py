"""Counting Qwen tokens without the model: Qwen's BPE vocabulary through tiktoken, as Qwen-Agent does.

The vocabulary file (`qwen.tiktoken`, 2.5 MB) is fetched by `scripts/fetch_assets.sh` from the qwen-agent wheel on
PyPI; tiktoken's stock encodings would download on first use, which a closed machine cannot do.
"""

from __future__ import annotations

import base64
import logging
from functools import lru_cache
from pathlib import Path
from typing import Callable

import tiktoken

log = logging.getLogger(__name__)

QWEN_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>") + tuple(f"<|extra_{i}|>" for i in range(205))
QWEN_SPECIAL_START_ID = 151643

TokenCounter = Callable[[str], int]


@lru_cache(maxsize=4)
def qwen_encoding(vocab_path: Path) -> tiktoken.Encoding:
    """Build Qwen's tiktoken encoding from its vocabulary file."""
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in vocab_path.read_bytes().splitlines() if line)
    }
    specials = {token: QWEN_SPECIAL_START_ID + i for i, token in enumerate(QWEN_SPECIAL_TOKENS)}
    return tiktoken.Encoding("qwen", pat_str=QWEN_SPLIT_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def estimate_tokens(text: str) -> int:
    """A deliberately generous estimate (one token per CJK character, per 3 bytes otherwise)."""
    cjk = sum(1 for ch in text if ord(ch) > 0x2E80)
    return cjk + (len(text.encode("utf-8")) - 3 * cjk) // 3 + 1


def qwen_token_counter(vocab_path: Path) -> TokenCounter:
    """Count with Qwen's vocabulary when the file is there; otherwise fall back to the estimate, and say so."""
    if not vocab_path.is_file():
        log.warning("Qwen vocabulary %s not found; estimating token counts (run scripts/fetch_assets.sh)", vocab_path)
        return estimate_tokens
    encoding = qwen_encoding(vocab_path)
    return lambda text: len(encoding.encode(text, disallowed_special=()))
