"""Numbers as people write them in answers: read out of text, so answers can be checked and scored by value.

    numbers_in("共200节，每周3次")        → 200, 3
    numbers_in("1.50 hours, 1,000 views") → 1.50 (= 1.5), 1,000 (= 1000, or 1 and 000 if it was a list)
    numbers_in("since 2022-01-01")        → one date (2022, 1, 1): its parts count as numbers, the date is no "1"
    numbers_in("两次, twice", words=True) → 2, 2 (number words only when asked: scoring and grounding sources)

Digits are compared by value (`Decimal`), so 1.5 is 1.50 and 200 is 200.0. A date is one mention (its parts are
its numbers). Line-start list markers ("1. …", "2. …" on two lines or more) are numbering, not numbers.

Number words are read only where they help and cannot hurt: English words as whole words, Chinese numerals only
right before a measure word (两次, 二百节), since 一 alone is everywhere (一共, 一下, 统一).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from decimal import Decimal

_DATE = re.compile(r"(?<!\d)(\d{4})\s*[-/.年]\s*(\d{1,2})\s*[-/.月]\s*(\d{1,2})(?:\s*日)?(?!\d)")
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|\d+(?:\.\d+)?")
_LIST_MARKER = re.compile(r"^[ \t]*(\d{1,2})[.)、][ \t]", re.MULTILINE)

_EN_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
    "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
    "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50,
    "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000,
    "once": 1, "twice": 2, "thrice": 3,
}
_EN_WORD = re.compile(r"\b(" + "|".join(_EN_WORDS) + r")\b", re.IGNORECASE)
_ZH_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8,
              "九": 9}
_ZH_UNITS = {"十": 10, "百": 100, "千": 1000, "万": 10000}
# Measure words a count stands before: 两次, 三节, 二百个, 一门, 两周, 三小时, 五分钟, 两倍.
_ZH_NUMERAL = re.compile("([%s]+)(?=[次节个门周天年月位名种项倍课期章讲小分])" % "".join([*_ZH_DIGITS, *_ZH_UNITS]))


@dataclass(frozen=True)
class Mention:
    """One number (or date) in a text: its value, exactly as written, and what kind of mention it is.

    `parts` are the numbers it stands for when checked against others: a date's year, month and day; a
    comma-grouped number's groups too (`200,230` may be a list); just the value otherwise.
    """

    value: Decimal
    written: str
    kind: str = "number"  # number, date, word
    parts: tuple[Decimal, ...] = ()
    start: int = 0

    @property
    def decimals(self) -> int:
        """Digits written after the decimal point (0 for whole numbers, words and dates)."""
        exponent = self.value.as_tuple().exponent if self.kind == "number" and "." in self.written else 0
        return -exponent if isinstance(exponent, int) and exponent < 0 else 0


def fold(text: str) -> str:
    """Text as numbers are read from it: NFKC (full-width digits made plain), but the full-width comma of Chinese
    lists kept apart from thousands separators."""
    return unicodedata.normalize("NFKC", text.replace("，", "、"))


def numbers_in(text: str, *, words: bool = False) -> list[Mention]:
    """The numbers and dates in `text`, in order; number words too when `words` (see the module docstring)."""
    text = fold(text)
    found: list[Mention] = []
    taken: list[tuple[int, int]] = []
    for match in _DATE.finditer(text):
        year, month, day = (Decimal(int(group)) for group in match.groups())
        if 1 <= month <= 12 and 1 <= day <= 31:
            found.append(Mention(year * 10000 + month * 100 + day, match.group(0), "date", (year, month, day),
                                 match.start()))
            taken.append(match.span())
    markers = _list_markers(text)
    for match in _NUMBER.finditer(text):
        if any(start <= match.start() < end for start, end in taken) or match.start() in markers:
            continue
        found.append(_number(match.group(0), match.start()))
    if words:
        found += _words(text)
    return sorted(found, key=lambda mention: mention.start)


def as_number(text: str) -> Decimal | None:
    """`text` as a number when it is one number and nothing else (`"200"`, `"1.5"`, `"１０"`), else None."""
    folded = fold(text).strip()
    if not re.fullmatch(r"\d+(?:\.\d+)?", folded):
        return None
    return Decimal(folded)


def _number(written: str, start: int) -> Mention:
    groups = written.split(".")[0].split(",")
    value = Decimal(written.replace(",", ""))
    parts = (value, *(Decimal(group) for group in groups)) if len(groups) > 1 else (value,)
    return Mention(value, written, "number", parts, start)


def _list_markers(text: str) -> set[int]:
    """Where the numbering of a list stands ("1. …", "2. …", one per line): only when there are two or more."""
    markers = list(_LIST_MARKER.finditer(text))
    if len(markers) < 2:
        return set()
    return {match.start(1) for match in markers}


def _words(text: str) -> list[Mention]:
    found = [_word(_EN_WORDS[m.group(1).lower()], m.group(0), m.start()) for m in _EN_WORD.finditer(text)]
    for match in _ZH_NUMERAL.finditer(text):
        value = zh_numeral_value(match.group(1))
        if value is not None:
            found.append(_word(value, match.group(1), match.start()))
    return found


def _word(value: int, written: str, start: int) -> Mention:
    return Mention(Decimal(value), written, "word", (Decimal(value),), start)


def zh_numeral_value(numeral: str) -> int | None:
    """二百三十 → 230, 两 → 2, 十五 → 15; None when it is no well-formed numeral."""
    total, section, digit = 0, 0, None
    for char in numeral:
        if char in _ZH_DIGITS:
            if digit is not None and digit != 0:
                return None  # two digits in a row (一二) is no numeral here
            digit = _ZH_DIGITS[char]
        else:
            unit = _ZH_UNITS[char]
            if unit == 10000:
                total += (section + (digit or 0)) * unit
                section, digit = 0, None
                continue
            section += (1 if digit is None else digit) * unit
            digit = None
    return total + section + (digit or 0)
