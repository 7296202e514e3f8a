"""Answers that loop: a small model decoding greedily can fall into repeating one phrase until its token limit
("I am sorry, I am sorry, I am sorry, …"). The grammar cannot forbid that (the answer is well formed), so the
answer a user reads keeps one copy of the phrase instead of fifty, and drops the half copy the limit cut off.

Only phrases with a letter in them, at least `MIN_REPEATS` times in a row and `MIN_SPAN` characters in all, count
as a loop: numbers ("10000000000"), rules ("-----") and short natural repetition ("ha ha ha") stay as written.
"""

from __future__ import annotations

import re

MIN_REPEATS = 4
MIN_SPAN = 24
_LOOP = re.compile(r"(.{2,60}?)\1{%d,}" % (MIN_REPEATS - 1), re.DOTALL)


def collapse_loops(text: str) -> str:
    """`text` with every loop cut to its first copy (and a cut-off partial copy at the very end dropped)."""
    pieces, position = [], 0
    for match in _LOOP.finditer(text):
        unit = match.group(1)
        if len(match.group(0)) < MIN_SPAN or not any(char.isalpha() for char in unit):
            continue
        pieces.append(text[position:match.start()] + unit)
        position = match.end()
        if unit.startswith(text[position:]):  # the token limit cut the next copy short: nothing of it is kept
            position = len(text)
    pieces.append(text[position:])
    return "".join(pieces).rstrip() if position else text
