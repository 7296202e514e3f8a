"""Speculative tokens from a row's own context (engine/speculative.py): what is guessed, and how many a step
may check."""

from __future__ import annotations

from agent.llm.engine.speculative import PromptLookup, SpeculativeLength, SpeculativeLimits


def test_the_guess_is_what_followed_the_last_earlier_occurrence_of_the_newest_tokens() -> None:
    # "Action: course_query\nAction Input: {...}" seen once; the row has just written "Action:" again.
    index = PromptLookup([5, 6, 7, 8, 9, 1, 2, 5, 6])
    assert index.propose(3) == [7, 8, 9]


def test_a_longer_match_wins_over_a_shorter_more_recent_one() -> None:
    # The newest tokens are (1, 2, 3). The 3-gram occurred at the start (followed by 4); the 1-gram "3" occurred
    # more recently (followed by 9), but the longer match is the better guess.
    index = PromptLookup([1, 2, 3, 4, 3, 9, 1, 2, 3])
    assert index.propose(1) == [4]


def test_the_index_follows_the_tokens_a_row_generates() -> None:
    index = PromptLookup([10, 11, 12, 13])
    assert index.propose(2) == []  # 13 never appeared before
    index.extend([10, 11])
    assert index.propose(2) == [12, 13]
    index.extend([12, 99])
    assert index.propose(2) == []  # (12, 99) and 99 are new
    index.extend([10])
    assert index.propose(4) == [11, 12, 99, 10]  # the latest occurrence of 10 is the second one


def test_no_guess_when_nothing_repeats_or_none_is_allowed() -> None:
    assert PromptLookup([1, 2, 3]).propose(5) == []
    assert PromptLookup([1, 2, 1]).propose(0) == []
    assert PromptLookup([]).propose(3) == []


def test_rows_share_the_steps_tokens_and_a_full_batch_checks_none() -> None:
    limits = SpeculativeLimits(per_row=5, per_step=8)
    assert limits.for_rows(1) == 5  # 1 + 5 fits in 8
    assert limits.for_rows(2) == 3
    assert limits.for_rows(4) == 1
    assert limits.for_rows(8) == 0
    assert SpeculativeLimits(per_row=0, per_step=8).for_rows(1) == 0  # SPECULATIVE_TOKENS=0: off


def test_a_rows_guesses_grow_while_the_model_takes_them_whole_and_shrink_when_it_cuts_them_short() -> None:
    length = SpeculativeLength()
    assert length.clamp(5) == 5  # the first guess: as long as the step allows
    length.judge(offered=5, agreed=1, most=5)
    assert length.clamp(5) == 4
    for _ in range(6):
        length.judge(offered=length.clamp(5), agreed=0, most=5)
    assert length.clamp(5) == 1  # never below one: a guess of one costs a column at most
    length.judge(offered=1, agreed=1, most=5)
    assert length.clamp(5) == 3
    length.judge(offered=3, agreed=3, most=5)
    length.judge(offered=5, agreed=5, most=5)
    assert length.clamp(5) == 5  # grows up to SPECULATIVE_TOKENS, not past it
    assert length.clamp(2) == 2  # and a step with less room still caps it


def test_a_step_that_offered_no_guess_leaves_the_length_alone() -> None:
    length = SpeculativeLength()
    length.clamp(4)
    length.judge(offered=0, agreed=0, most=4)
    assert length.clamp(4) == 4
