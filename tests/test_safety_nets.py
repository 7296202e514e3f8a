"""The safety nets for small models' final answers, tested directly, case by case, with sentences a model or a user
might write: numbers read by value (agent/numbers.py), the numbers of an answer that nothing supports
(agent/grounding.py), garbage cut or flagged, whole and streamed (agent/garbage.py), the accept / remind / replace
verdict (agent/review.py), and which known course names a question mentions (tools/mentions.py)."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from agent.apologies import APOLOGIES
from agent.garbage import MIN_PATTERN_REPEATS, STREAM_SPAN, clean_answer, streamable
from agent.grounding import Grounds
from agent.numbers import numbers_in
from agent.review import AnswerReview, Verdict
from tools.calculator import calculator
from tools.courses import MATCH_THRESHOLD, Course, normalize_name
from tools.mentions import mentioned

# The seed courses (migrations/0003_courses.sql), as course_query and course_list show them to the model.
SEED_COURSES = (
    Course("大模型技术实战", 200, 3, 2),
    Course("机器学习实战", 230, 2, 1.5),
    Course("深度学习实战", 150, 1, 3),
    Course("AI数据分析", 10, 1, 1),
)
SEED_NAMES = tuple(course.name for course in SEED_COURSES)
LLM_COURSE = SEED_COURSES[0]  # 200 lessons, 3 updates a week, 2 hours each
ML_COURSE = SEED_COURSES[1]  # 230 lessons, 2 updates a week, 1.5 hours each
NOTE = "(You already called course_list with exactly these arguments: not run again; the answer is asked for now.)"


def values(text: str, *, words: bool = False) -> list[Decimal]:
    return [mention.value for mention in numbers_in(text, words=words)]


def observation(course: Course, *fields: str) -> str:
    """What course_query returns for `course`: one JSON record, with `fields` only when given."""
    record = course.as_observation(fields) if fields else course.as_observation()
    return json.dumps(record, ensure_ascii=False)


def grounds_after(question: str, *observations: str, history: tuple[str, ...] = ()) -> Grounds:
    grounds = Grounds(question, history)
    for text in observations:
        grounds.observe(text)
    return grounds


def streamed(answer: str) -> list[str]:
    """What `streamable` lets a chat show at every point while `answer` is written, character by character."""
    return [streamable(answer[:end]) for end in range(len(answer) + 1)]


def mentions(question: str, names: tuple[str, ...] = SEED_NAMES) -> list[str]:
    """The course names `question` mentions, matched as course_query matches them."""
    return mentioned(question, names, normalize_name, MATCH_THRESHOLD)


# --- numbers ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("每次更新1.50小时", [Decimal("1.5")]),
    ("It has 200.0 lessons.", [Decimal(200)]),
    ("The course has 1,000 views.", [Decimal(1000)]),
    ("共200节，每周3次", [Decimal(200), Decimal(3)]),
    ("课时分别是200，230", [Decimal(200), Decimal(230)]),  # a Chinese list's comma is no thousands separator
    ("共２００节", [Decimal(200)]),  # full-width digits
    ("每次3.5小时", [Decimal("3.5")]),
])
def test_numbers_are_read_by_value(text, expected):
    assert values(text) == expected


@pytest.mark.parametrize("text", ["since 2024-03-01", "2024年3月1日开课", "starts 2024/3/1"])
def test_a_date_is_one_mention_with_its_parts(text):
    [date] = numbers_in(text)
    assert date.kind == "date"
    assert date.parts == (Decimal(2024), Decimal(3), Decimal(1))


@pytest.mark.parametrize(("text", "expected"), [
    ("课程有：\n1. 大模型技术实战\n2. 机器学习实战\n", []),
    ("Steps:\n1) look it up\n2) answer\n3) done", []),
    ("课程有：\n1. 大模型技术实战 200节\n2. 机器学习实战 230节", [Decimal(200), Decimal(230)]),
    ("1. The answer is one line.", [Decimal(1)]),  # one line is no list: its "1" may be the answer
])
def test_line_start_list_markers_are_not_numbers(text, expected):
    assert values(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("每周更新两次", [Decimal(2)]),
    ("一共二百节课", [Decimal(200)]),
    ("It is updated twice a week.", [Decimal(2)]),
    ("two courses", [Decimal(2)]),
    ("一共有多少节课？", []),  # 一共 is no 1
    ("统一安排一下", []),
    ("someone often asks", []),  # "one" and "ten" only as whole words
    ("两", []),  # no measure word after it
])
def test_number_words_are_read_only_when_asked_and_only_before_a_measure_word(text, expected):
    assert values(text, words=True) == expected
    assert values(text) == []


# --- grounding --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("answer", [
    "大模型技术实战共有200节课。",
    "It has 200.0 lessons.",
    "大模型技术实战每周更新3次，每次2小时。",
    "It is updated 3 times a week, 2.00 hours each time.",
    "每周3次 × 每次2小时 = 6小时。",
    "3 updates × 2 hours = 6 hours a week.",
    "大模型技术实战一共200节课，是其中一门课。",  # 一共, 一门: number words in an answer are never checked
    "It is one of the courses and has 200 lessons.",
])
def test_a_right_answer_from_the_observation_is_grounded(answer):
    grounds = grounds_after("大模型技术实战有多少节课，每周更新几次？", observation(LLM_COURSE))
    assert grounds.unsupported(answer) == []


@pytest.mark.parametrize(("answer", "unsupported"), [
    ("大模型技术实战有20节课。", ["20"]),  # the observation says 200
    ("It has 2000 lessons.", ["2000"]),
    ("每周一共6小时。", ["6"]),  # 3×2, but neither 3 nor 2 is written: a guess cannot be told from it
    ("It takes 6 hours a week.", ["6"]),
    ("It has 200 lessons and 7 updates a week.", ["7"]),
])
def test_a_wrong_or_unexplained_number_is_ungrounded(answer, unsupported):
    grounds = grounds_after("大模型技术实战有多少节课？", observation(LLM_COURSE))
    assert grounds.unsupported(answer) == unsupported


@pytest.mark.parametrize(("answer", "unsupported"), [
    ("每次更新1.5小时。", []),
    ("Each update takes 1.50 hours.", []),
    ("每次更新2小时。", ["2"]),  # 1.5 rounded to a whole number is a different answer
    ("Each update takes about 2 hours.", ["2"]),
])
def test_a_fraction_is_never_grounded_as_a_whole_number(answer, unsupported):
    grounds = grounds_after("机器学习实战每次更新多久？", observation(ML_COURSE, "hours_per_update"))
    assert grounds.unsupported(answer) == unsupported


@pytest.mark.parametrize(("answer", "unsupported"), [
    ("200 ÷ 3 ≈ 66.67", []),
    ("It comes to about 66.67 weeks.", []),
    ("约66.7周", []),
    ("It comes to 67 weeks.", ["67"]),  # a rounded value counts with the decimals it shows, never as a whole
    ("It comes to 66.68 weeks.", ["66.68"]),
])
async def test_a_calculator_result_is_grounded_as_rounded(answer, unsupported):
    grounds = grounds_after("200节课，每周3节，要多少周？", await calculator("200/3"))
    assert grounds.unsupported(answer) == unsupported


@pytest.mark.parametrize(("answer", "unsupported"), [
    ("It starts on 2024-03-01.", []),
    ("2024年3月1日开课。", []),
    ("开课日期是2024/3/1。", []),
    ("It starts on 2024-03-02.", ["2024-03-02"]),
    ("2025年3月1日开课。", ["2025年3月1日"]),
])
def test_a_date_is_grounded_however_it_is_written(answer, unsupported):
    grounds = grounds_after("When does it start?", json.dumps({"课程名称": "大模型技术实战", "开课日期": "2024-03-01"},
                                                                ensure_ascii=False))
    assert grounds.unsupported(answer) == unsupported


@pytest.mark.parametrize(("question", "history", "answer", "unsupported"), [
    ("What is 6*7?", (), "6 × 7 = 42", []),  # the question's numbers make the step visible
    ("两周一共多少小时？", (), "2 weeks", []),  # 两周 in the question grounds 2
    ("那第二门课呢？", ("I have 7 apples and 12 pears.",), "You have 12 pears.", []),
    ("那第二门课呢？", ("I have 7 apples and 12 pears.",), "You have 13 pears.", ["13"]),
    ("How many lessons?", (), "It has 1,000 lessons.", ["1,000"]),
])
def test_numbers_from_the_question_and_earlier_messages_are_grounded(question, history, answer, unsupported):
    assert Grounds(question, history).unsupported(answer) == unsupported


def test_a_thousands_separator_matches_the_plain_number():
    grounds = grounds_after("How many views?", '{"views": 1000}')
    assert grounds.unsupported("It has 1,000 views.") == []
    assert grounds.unsupported("It has 10,000 views.") == ["10,000"]


# --- garbage ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("answer", [
    "42.0000000000000042.0000000000000042.000000000000",
    "1000000000000000",
    "The answer is 1000000000000000 lessons.",
    "",
    "   ",
    "What is the 课程列表 API useful for?",  # the prompt echoed, nothing else
])
def test_garbage_is_flagged(answer):
    assert clean_answer(answer).problem is not None


@pytest.mark.parametrize(("answer", "kept"), [
    ("I am sorry, I am sorry, I am sorry, I am sorry, I am sorry, I am sorry,", "I am sorry,"),
    ("共200节。I am sorry, I am sorry, I am sorry, I am sorry, I am sorry,", "共200节。I am sorry,"),
    ("2022-01-01 2022-01-01 2022-01-01 2022-01-01 2022-01-01", "2022-01-01"),
    (" ".join(f"{n}." for n in range(10, 40)), "10."),  # a counting loop, to a small model's token limit
    (" ".join(f"2022-01-{day:02d}" for day in range(1, 29)), "2022-01-01"),
    ("的的的的的的的的的的的的", "的"),
    ("100.000\n" + NOTE, "100.000"),  # a note copied from the trace
    ("共200节。" + NOTE, "共200节。"),
    ("the final answer to the original question: 200节", "200节"),
    ("I now know the final answer. 共200节。", "共200节。"),
    ("共200节。What is", "共200节。"),  # an invented question, cut off
])
def test_loops_notes_and_echoes_are_cut(answer, kept):
    assert clean_answer(answer) == clean_answer(kept)
    assert clean_answer(answer).text == kept


@pytest.mark.parametrize("answer", [
    "The lessons are 200, 230, 150, 10, 3.",
    "1, 2, 3, 4, 5",  # five numbers counting up are still a list
    "第1、2、3、4、5、6、7节是免费的。",  # and seven, as a strong model writes them out
    ", ".join(str(day) for day in range(1, MIN_PATTERN_REPEATS)),  # up to the loop's length
    "The courses are: 200, 230, 150, 10, 3, 2",  # six that do not count steadily too
    "大模型技术实战有200节课。",
    "It has 200 lessons, updated 3 times a week.",
])
def test_a_real_answer_is_kept_whole(answer):
    assert clean_answer(answer).text == answer
    assert clean_answer(answer).problem is None


@pytest.mark.parametrize(("question", "answer", "echoed"), [
    ("How many lessons does 大模型技术实战 have?", "How many lessons does 大模型技术实战 have?", True),
    ("大模型技术实战有多少节课？", "大模型技术实战有多少节课", True),
    ("大模型技术实战有多少节课？", "大模型技术实战有200节课。", False),
    ("你好", "你好！", False),  # a greeting answered by a greeting
    ("Hello", "Hello! How can I help?", False),
])
def test_the_question_echoed_is_garbage_but_a_greeting_returned_is_not(question, answer, echoed):
    assert (clean_answer(answer, question).problem is not None) == echoed


@pytest.mark.parametrize("answer", ["共200节。" + NOTE, "It has 200 lessons. " + NOTE, "100.000\n" + NOTE])
def test_a_stream_never_shows_a_notes_beginning(answer):
    shown = streamed(answer)
    assert all("(Y" not in text and "You" not in text for text in shown), [t for t in shown if "(Y" in t]
    assert shown[-1] == clean_answer(answer).text


@pytest.mark.parametrize(("answer", "unit"), [
    ("I am sorry, " * 8, "I am sorry,"),
    ("共200节。" + "Sorry! " * 10, "Sorry!"),
    ("2022-01-01 " * 8, "2022-01-01"),
])
def test_a_stream_never_shows_a_loop_beyond_its_third_copy(answer, unit):
    assert max(text.count(unit) for text in streamed(answer)) == 3


@pytest.mark.parametrize(("answer", "unit"), [("1." * 30, "1."), ("3. " * 30, "3."), ("的" * 30, "的")])
def test_a_stream_never_shows_a_short_loop_over_the_stream_span(answer, unit):
    """Copies of a unit too short to fill STREAM_SPAN in three are shown until they would fill it."""
    assert max(len(text) for text in streamed(answer)) < STREAM_SPAN
    assert clean_answer(answer).text == unit


def test_a_stream_never_shows_a_counting_loop_beyond_a_list_of_its_length():
    """A counting loop streams as far as a list may go (fifteen numbers are an answer), never further."""
    loop = "".join(f"{number}. " for number in range(10, 30))
    shown = streamed(loop)
    assert max(len(values(text)) for text in shown) == MIN_PATTERN_REPEATS
    assert shown[-1] == "10."


# --- review -----------------------------------------------------------------------------------------------------

def review_of(question: str, *observations: str) -> AnswerReview:
    return AnswerReview(question, grounds_after(question, *observations))


@pytest.mark.parametrize(("question", "bad_answer", "language"), [
    ("大模型技术实战有多少节课？", "大模型技术实战有20节课。", "zh"),
    ("How many lessons does 大模型技术实战 have?", "It has 20 lessons.", "en"),
    ("大模型技术实战有多少节课？", "42.0000000000000042.0000000000000042.000000000000", "zh"),
    ("How many lessons does 大模型技术实战 have?", "How many lessons does 大模型技术实战 have?", "en"),
])
def test_a_bad_answer_is_reminded_once_then_replaced_by_the_honest_answer(question, bad_answer, language):
    review = review_of(question, observation(LLM_COURSE))
    first, second = review.review(bad_answer), review.review(bad_answer)
    assert first.verdict == Verdict.REMIND and first.reminder and first.error
    assert second.verdict == Verdict.REPLACE
    assert second.answer == APOLOGIES["unconfirmed"][language]
    assert second.error == first.error


def test_an_ungrounded_answers_reminder_lists_what_the_observations_hold():
    reminded = review_of("大模型技术实战有多少节课？", observation(LLM_COURSE)).review("共20节课。")
    assert reminded.error.startswith("ungrounded: 20")
    assert "20" in reminded.reminder and "课时 200" in reminded.reminder


def test_one_reminder_per_turn_whatever_it_was_for():
    review = review_of("How many lessons does 大模型技术实战 have?", observation(LLM_COURSE))
    assert review.review("1000000000000000").verdict == Verdict.REMIND
    replaced = review.review("It has 20 lessons.")
    assert replaced.verdict == Verdict.REPLACE and replaced.error.startswith("ungrounded")


@pytest.mark.parametrize(("answer", "shown"), [
    ("It has 200 lessons.", "It has 200 lessons."),
    ("共200节。" + NOTE, "共200节。"),
    ("I now know the final answer. 大模型技术实战有200节课。", "大模型技术实战有200节课。"),
])
def test_a_right_answer_is_accepted_cleaned_even_after_a_reminder(answer, shown):
    review = review_of("大模型技术实战有多少节课？", observation(LLM_COURSE))
    assert review.review("共20节课。").verdict == Verdict.REMIND
    accepted = review.review(answer)
    assert (accepted.verdict, accepted.answer, accepted.error) == (Verdict.ACCEPT, shown, None)


def test_no_reminder_when_no_model_call_is_left():
    review = review_of("大模型技术实战有多少节课？", observation(LLM_COURSE))
    assert review.review("共20节课。", may_remind=False).verdict == Verdict.REPLACE


def test_numbers_are_not_checked_when_grounding_is_off():
    review = AnswerReview("大模型技术实战有多少节课？", None)
    assert review.review("共20节课。").verdict == Verdict.ACCEPT
    assert review.review("1000000000000000").verdict == Verdict.REMIND  # garbage is still caught


# --- mentions ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("question", "expected"), [
    ("大模型实战有多少节课？", ["大模型技术实战"]),
    ("How many lessons does 大模型技术实战 have?", ["大模型技术实战"]),
    ("大模型技术实战课程每周更新几次？", ["大模型技术实战"]),
    ("深度学习有几节课？", ["深度学习实战"]),
    ("机器学习实战和深度学习实战哪个课时多？", ["机器学习实战", "深度学习实战"]),
    ("ai数据分析有几节课", ["AI数据分析"]),
    ("强化学习实战有多少节课？", []),  # 学习实战 is shared: only 机器 or 深度 would tell which
    ("你好，今天天气怎么样？", []),
])
def test_a_question_mentions_the_courses_it_names_loosely(question, expected):
    assert mentions(question) == expected


@pytest.mark.parametrize("names", [("AI", *SEED_NAMES), ("AI", "大模型技术实战")])
@pytest.mark.parametrize(("question", "expected"), [
    ("Can you explain this?", []),
    ("What does the email say?", []),
    ("Tell me about AI.", ["AI"]),
    ("AI有几节课？", ["AI"]),
])
def test_a_latin_name_matches_whole_words_only(names, question, expected):
    assert mentions(question, names) == expected


@pytest.mark.parametrize(("question", "expected"), [
    ("数据分析有几节课？", ["数据分析"]),
    ("数据分有几节课？", []),  # a name contained in another has no pair of its own: it must appear whole
    ("数据析有几节课？", []),
])
def test_a_name_contained_in_another_must_appear_whole(question, expected):
    assert mentions(question, ("数据分析", "AI数据分析")) == expected
