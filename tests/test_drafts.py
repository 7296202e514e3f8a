"""Draft tokens from a row's own context (agent/llm/drafts.py): what is guessed, and how many a step may check."""

from __future__ import annotations

from agent.llm.drafts import DraftIndex, DraftLimits


def test_the_guess_is_what_followed_the_last_earlier_occurrence_of_the_newest_tokens() -> None:
    # "Action: course_query\nAction Input: {...}" seen once; the row has just written "Action:" again.
    index = DraftIndex([5, 6, 7, 8, 9, 1, 2, 5, 6])
    assert index.propose(3) == [7, 8, 9]


def test_a_longer_match_wins_over_a_shorter_more_recent_one() -> None:
    # The newest tokens are (1, 2, 3). The 3-gram occurred at the start (followed by 4); the 1-gram "3" occurred
    # more recently (followed by 9), but the longer match is the better guess.
    index = DraftIndex([1, 2, 3, 4, 3, 9, 1, 2, 3])
    assert index.propose(1) == [4]


def test_the_index_follows_the_tokens_a_row_generates() -> None:
    index = DraftIndex([10, 11, 12, 13])
    assert index.propose(2) == []  # 13 never appeared before
    index.extend([10, 11])
    assert index.propose(2) == [12, 13]
    index.extend([12, 99])
    assert index.propose(2) == []  # (12, 99) and 99 are new
    index.extend([10])
    assert index.propose(4) == [11, 12, 99, 10]  # the latest occurrence of 10 is the second one


def test_no_guess_when_nothing_repeats_or_none_is_allowed() -> None:
    assert DraftIndex([1, 2, 3]).propose(5) == []
    assert DraftIndex([1, 2, 1]).propose(0) == []
    assert DraftIndex([]).propose(3) == []


def test_rows_share_the_steps_tokens_and_a_full_batch_checks_no_drafts() -> None:
    limits = DraftLimits(per_row=5, per_step=8)
    assert limits.for_rows(1) == 5  # 1 + 5 fits in 8
    assert limits.for_rows(2) == 3
    assert limits.for_rows(4) == 1
    assert limits.for_rows(8) == 0
    assert DraftLimits(per_row=0, per_step=8).for_rows(1) == 0  # SPECULATIVE_TOKENS=0: off
