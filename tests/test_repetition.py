"""Answers that loop (agent/repetition.py): a user reads one copy of a repeated phrase, and nothing else changes."""

from __future__ import annotations

import pytest

from agent.repetition import collapse_loops


@pytest.mark.parametrize("looping, expected", [
    ("I am sorry, " * 50 + "I am sor", "I am sorry,"),  # the token limit cut the last copy
    ("The course has 200 lessons. " + "I am glad to say that " * 10,
     "The course has 200 lessons. I am glad to say that"),
    ("好的，我来查一下。" * 8, "好的，我来查一下。"),
    ("Answer: 3\n" + "What is the final answer?\n" * 6 + "Bye.", "Answer: 3\nWhat is the final answer?\nBye."),
    ("最少？\n\nThe answer is 最少？\n\nThe answer is 最少？\n\nThe answer is 最少？",  # the eval's, stopped after three
     "最少？\n\nThe answer is"),  # one copy of the phrase; the last, a partial copy, dropped
])
def test_a_looping_answer_keeps_one_copy_of_the_phrase(looping: str, expected: str) -> None:
    assert collapse_loops(looping) == expected


@pytest.mark.parametrize("text", [
    "大模型技术实战课程目前一共上线了200节课。",
    "Ten billion is 10000000000, a million 1000000.",  # digits repeat, but a number is not a loop
    "------------------------------------",  # a rule
    "ha ha ha ha",  # short natural repetition
    "| course | lessons |\n|---|---|\n| 机器学习实战 | 230 |\n| 深度学习实战 | 150 |",
    "1. 1.1.1.1.1.1.1.1.1.1.1",  # no letter in the unit: left alone, however odd
    "| 课程 | 课时 | 每周 | 小时 | 总计 |\n| --- | --- | --- | --- | --- |\n| 大模型技术实战 | 200 | 3 | 2 | 6 |",  # layout
    "It has 200 lessons. It has 200 lessons.",  # said twice is no loop
    "",
])
def test_text_that_does_not_loop_is_returned_exactly(text: str) -> None:
    assert collapse_loops(text) == text
