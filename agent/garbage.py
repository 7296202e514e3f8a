"""Garbage never reaches a user: what a small model's final answer may hold that is no answer, cut or flagged.

    notes for the model      "(You already called course_list with …": a note copied from the trace
    the prompt echoed        "the final answer to the original question", "What is the 课程列表 API useful for?"
    loops                    "I am sorry, I am sorry, …", "1.1.1.1…", "3. 3. 3. …" (agent/repetition.py)
    counting loops           "10. 11. 12. 13. …", "2022-01-12 2022-01-13 …": one shape, the numbers changing
    runs of one digit        "1000000000000000…", "42.0000000000000042…"
    the question echoed      the user's own question given back as the answer

Notes, echoes and loops are cut (a loop keeps its first copy); what is left is judged: an answer with nothing
left, a run of one digit, or the question echoed is garbage, and agent/review.py turns it back or replaces it.
`clean_answer` judges a whole answer; `streamable` is the eager cut applied to an answer still being written.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from agent.numbers import fold
from agent.prompts import model_notes
from agent.repetition import collapse_loops

# Copies of a number pattern ("#. ") in a row that make a counting loop: sixteen, so that a list a strong model
# writes out ("第1、2、3、4、5、6、7节", days 1 to 14) stays a list; a small model's loop runs to its token limit, far
# longer.
MIN_PATTERN_REPEATS = 16
# A run of one digit this long is no number anyone means (10^11 and up, or float noise).
MAX_DIGIT_RUN = 11
# A loop is cut from the stream once it spans this many characters in three copies ("1.1.1.1.1.1.").
STREAM_SPAN = 12
# A run of one letter or character (的的的的…) this long is cut to one.
MAX_CHAR_RUN = 9
# How close an answer may come to the question before it is the question echoed (difflib's ratio), for questions
# of some length: "你好" answered "你好！" is a greeting returned, not an echo.
ECHO_RATIO = 0.8
ECHO_MIN_CHARS = 10

# Where a note meant for the model starts (agent/prompts.py): a copy of one in an answer is cut from there to the
# end, since what follows is the note, not the answer.
NOTE_OPENINGS = tuple(dict.fromkeys(note.split("{")[0][:24].strip() for note in model_notes())) + (
    "You already called", "The observations hold")
_ECHOES = [re.compile(pattern, re.IGNORECASE) for pattern in (
    r"[\"“']?(?:the\s+)?final answer to the (?:original\s+)?(?:input\s+)?question[\"”']?[:：]?",
    r"[\"“']?What is the [^?？\n]{0,60}? API useful for\s*[?？]?[\"”']?",
    r"[\"“']?what is the final answer\s*[?？]?[\"”']?",
    r"(?:the\s+)?input question you must answer",
    r"you should always think about what to do",
    r"(?:should be one of|the action to take)[^\n]*",
    r"the result of the action",
    r"I now know the final answer[.。]?",
    r"Call this tool to interact with[^\n]*",
    r"Format the arguments as a JSON object\.?",
)]
# A question begun and cut off at the very end ("… What is"): what is left of an invented question.
_DANGLING_QUESTION = re.compile(r"[\"“'(]*\b(?:what|how|which|who|why|when|where)(?:\s+\w+){0,2}\s*[\"”']*$",
                                re.IGNORECASE)
_NUMBER_SHAPE = re.compile(r"\d+")
_CHAR_RUN = re.compile(r"([^\W\d_])\1{%d,}" % MAX_CHAR_RUN)
_DIGIT_RUN = re.compile(r"(\d)\1{%d,}" % MAX_DIGIT_RUN)


@dataclass(frozen=True)
class CleanAnswer:
    """An answer with the garbage cut out; `problem` says why what is left is no answer (None: it is one)."""

    text: str
    problem: str | None = None


def clean_answer(answer: str, question: str = "") -> CleanAnswer:
    """`answer` with notes, prompt echoes and loops cut; flagged when what is left is no answer."""
    text = _cut_counting_loops(collapse_loops(_strip_echoes(strip_notes(answer))))
    text = _CHAR_RUN.sub(r"\1", text).strip()
    if _DIGIT_RUN.search(fold(text)):
        return CleanAnswer(text, "garbage: a run of one digit")
    if not any(char.isalnum() for char in text):
        return CleanAnswer(text, "garbage: nothing but " + ("repetition or the prompt echoed" if answer.strip()
                                                             else "blanks"))
    if _echoes(text, question):
        return CleanAnswer(text, "garbage: the question echoed")
    return CleanAnswer(text)


def streamable(text: str) -> str:
    """The part of an answer still being written that may be shown: notes (and what may grow into one) and
    echoes cut, and a loop stopped at its third copy rather than its fourth (the finished answer is judged whole)."""
    text = _strip_echoes(strip_notes(_without_note_start(text)))
    text = _cut_counting_loops(collapse_loops(text, min_repeats=3, min_span=STREAM_SPAN))
    cut = _DIGIT_RUN.search(text) or _CHAR_RUN.search(text)
    return text[:cut.start()].rstrip() if cut else text


def _echoes(answer: str, question: str) -> bool:
    """Whether `answer` is the question given back."""
    if len(question) < ECHO_MIN_CHARS:
        return False
    return difflib.SequenceMatcher(None, fold(answer).casefold(), fold(question).casefold()).ratio() >= ECHO_RATIO


def strip_notes(text: str) -> str:
    """`text` up to the first note meant for the model that it copies (whole, or cut off by the token limit)."""
    cut = min((index for opening in NOTE_OPENINGS if (index := text.find(opening)) >= 0), default=len(text))
    return text[:cut].rstrip()


def _without_note_start(text: str) -> str:
    """`text` without a tail that may still grow into a note ("(You alr")."""
    for size in range(min(len(text), max(map(len, NOTE_OPENINGS))), 1, -1):
        tail = text[-size:]
        if any(opening.startswith(tail) for opening in NOTE_OPENINGS):
            return text[:-size]
    return text


def _strip_echoes(text: str) -> str:
    for echo in _ECHOES:
        text = echo.sub("", text)
    return _DANGLING_QUESTION.sub("", text.rstrip()).strip()


def _cut_counting_loops(text: str, min_repeats: int = MIN_PATTERN_REPEATS) -> str:
    """Cut a counting loop ("10. 11. 12. …", "2022-01-12 2022-01-13 …") after its first copy.

    It is found in the text's shape, every number written as "#": one unit of digits and punctuation (no letters)
    repeated, whose numbers count steadily from copy to copy (each place in the unit an arithmetic progression,
    a constant included). A list that is no progression ("200, 230, 150, 10, 3, 2") is an answer, not a loop.
    """
    numbers = list(_NUMBER_SHAPE.finditer(text))
    if len(numbers) < min_repeats:
        return text
    shape, offsets, position = [], [], 0
    for match in numbers:  # build the shape, remembering where each of its characters is in the text
        shape.append(text[position:match.start()])
        offsets.extend(range(position, match.start()))
        shape.append("#")
        offsets.append(match.start())
        position = match.end()
    shape.append(text[position:])
    offsets.extend(range(position, len(text) + 1))
    shaped = "".join(shape)
    for loop in re.finditer(r"(.{1,40}?)\1{%d,}" % (min_repeats - 1), shaped, re.DOTALL):
        unit = loop.group(1)
        if "#" not in unit or any(char.isalpha() for char in unit):
            continue
        inside = [int(m.group(0)) for m in numbers if offsets[loop.start()] <= m.start() < offsets[loop.end() - 1] + 1]
        if _counts_steadily(inside, unit.count("#")):
            return text[:offsets[loop.start() + len(unit)]].rstrip()
    return text


def _counts_steadily(values: list[int], places: int) -> bool:
    """Whether the numbers of a repeated unit with `places` numbers step evenly at each place."""
    for place in range(places):
        column = values[place::places]
        steps = {later - earlier for earlier, later in zip(column, column[1:])}
        if len(steps) > 1:
            return False
    return True
