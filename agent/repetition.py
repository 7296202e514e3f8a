"""Answers that loop: a small model decoding greedily can fall into repeating one phrase until its token limit
("I am sorry, I am sorry, I am sorry, …", "1.1.1.1.1…", "2022-01-01 2022-01-01 …"). The grammar cannot forbid that
(the answer is well formed), so the answer a user reads keeps one copy of the phrase instead of fifty, and drops
the half copy the limit cut off.

A phrase of 2 to 60 characters, at least `MIN_REPEATS` times in a row and `MIN_SPAN` characters in all, is a loop
when it holds a letter or a digit. A run of one character is not a phrase: numbers ("10000000000") and rules
("-----") stay as written here (agent/garbage.py judges runs of one digit), and so do short natural repetition
("ha ha ha") and punctuation alone: a Markdown table's "| --- | --- | --- | --- |" is layout, not a loop.
"""

from __future__ import annotations

import re

# Three copies: a small model's loop can stop early ("最少？ The answer is 最少？ The answer is 最少？ …" ended on
# its own after three); MIN_SPAN keeps short natural repetition out.
MIN_REPEATS = 3
MIN_SPAN = 24
_LOOP = re.compile(r"(.{2,60}?)\1{%d,}" % (MIN_REPEATS - 1), re.DOTALL)


def collapse_loops(text: str, *, min_repeats: int = MIN_REPEATS, min_span: int = MIN_SPAN) -> str:
    """`text` with every loop cut to its first copy (and a cut-off partial copy at the very end dropped)."""
    pattern = _LOOP if min_repeats == MIN_REPEATS else re.compile(r"(.{2,60}?)\1{%d,}" % (min_repeats - 1),
                                                                  re.DOTALL)
    pieces, position = [], 0
    for match in pattern.finditer(text):
        unit = match.group(1)
        if len(match.group(0)) < min_span or len(set(unit)) == 1 or not any(char.isalnum() for char in unit):
            continue
        pieces.append(text[position:match.start()] + unit)
        position = match.end()
        if unit.startswith(text[position:]):  # the token limit cut the next copy short: nothing of it is kept
            position = len(text)
    pieces.append(text[position:])
    return "".join(pieces).rstrip() if position else text
