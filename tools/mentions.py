"""Which known names a text mentions, matched loosely: entity linking for questions (`大模型实战有多少节课？`
mentions 大模型技术实战).

A part of the text mentions a name when it is as close to it as a tool's own lookup asks (difflib's ratio, the
threshold given) and holds a distinctive pair of characters of that name, one no other known name has. The pair
keeps a near miss out: 强化学习实战 is 0.67 from 机器学习实战 and a window around 学习实战 is closer still, but only
机器 or 器学 tell 机器学习实战 from 深度学习实战, and the question holds neither. A name with no distinctive pair
(contained in another) must appear whole.

Letters and digits of Latin script form words: a name matches whole words only (the course "AI" is not in
"explain"); each CJK character is a word of its own.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from typing import Callable, Sequence

_WORD_CHAR = re.compile(r"[^\W_]", re.UNICODE)
# How much shorter or longer than the name a mention may be (大模型实战 for 大模型技术实战 is 2 shorter).
LENGTH_SLACK = 3


def mentioned(text: str, names: Sequence[str], normalize: Callable[[str], str], threshold: float) -> list[str]:
    """The `names` that `text` mentions, in the order of their first mention."""
    chars, starts, ends = _word_chars(text)
    keys = {name: normalize(name) for name in names}
    found: list[tuple[int, str]] = []
    for name, key in keys.items():
        others = [other for other_name, other in keys.items() if other_name != name]
        position = _mention(chars, starts, ends, key, _distinctive_pairs(key, others), threshold)
        if position is not None:
            found.append((position, name))
    return [name for _, name in sorted(found)]


def _word_chars(text: str) -> tuple[str, set[int], set[int]]:
    """The text's word characters, folded (NFKC, case), and where a mention may start and end: anywhere around a
    CJK character, at word boundaries in Latin script."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    chars: list[str] = []
    starts, ends = set(), set()
    previous_word = False
    for char in folded:
        if not _WORD_CHAR.match(char):
            if previous_word:
                ends.add(len(chars))
            previous_word = False
            continue
        latin = char.isascii()
        if not latin or not previous_word:
            starts.add(len(chars))
        if not latin and previous_word:
            ends.add(len(chars))
        if not latin:
            ends.add(len(chars) + 1)
        previous_word = latin
        chars.append(char)
    ends.add(len(chars))
    return "".join(chars), starts, ends


def _distinctive_pairs(key: str, others: Sequence[str]) -> set[str]:
    """The pairs of adjacent characters of `key` that no other name has."""
    theirs = {pair for other in others for pair in _pairs(other)}
    return _pairs(key) - theirs


def _pairs(text: str) -> set[str]:
    return {text[i:i + 2] for i in range(len(text) - 1)}


def _mention(chars: str, starts: set[int], ends: set[int], key: str, distinctive: set[str],
             threshold: float) -> int | None:
    """Where `chars` mentions `key` first, or None."""
    if not key:
        return None
    if not distinctive:
        index = chars.find(key)
        while index >= 0 and not (index in starts and index + len(key) in ends):
            index = chars.find(key, index + 1)
        return index if index >= 0 else None
    best: tuple[float, int] | None = None
    for anchor in sorted({i for pair in distinctive for i in _occurrences(chars, pair)}):
        for start, end in _windows(anchor, len(key), len(chars)):
            if start not in starts or end not in ends:
                continue
            score = difflib.SequenceMatcher(None, chars[start:end], key).ratio()
            if score >= threshold and (best is None or score > best[0]):
                best = (score, start)
        if best is not None:
            return best[1]
    return None


def _occurrences(text: str, pair: str) -> list[int]:
    found, index = [], text.find(pair)
    while index >= 0:
        found.append(index)
        index = text.find(pair, index + 1)
    return found


def _windows(anchor: int, length: int, limit: int) -> list[tuple[int, int]]:
    """The spans of plausible mention lengths that hold the pair at `anchor`."""
    spans = []
    for size in range(max(2, length - LENGTH_SLACK), length + LENGTH_SLACK + 1):
        for start in range(max(0, anchor + 2 - size), min(anchor, limit - size) + 1):
            spans.append((start, start + size))
    return spans
