"""Floods and their victims, through the real bot against the fake Bot API: access taken away while questions
wait, strangers writing again and again, a flood wait (429) for one chat, and the caps on what one user may queue.

Each test here was written against a break found by an outside probe (issue 13) and failed before its fix.
"""

from __future__ import annotations

from bot.telegram.i18n import text
from bot.telegram.refusals import RefusalLog
from bot.telegram.turns import TurnScheduler
from tests.fakes.telegram_bot import (ADMIN, ALICE, STRANGERS, final, private_chat, start_bot,
                                      telegram_server)
from tests.fakes.telegram_server import User

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

ALICE_CHAT = private_chat(ALICE)


def refusal(user: User) -> str:
    """What a sender without access is told (in their language)."""
    return text("not_allowed", "zh" if user.language_code.startswith("zh") else "en", user_id=user.id)


def strangers(count: int, first_id: int = 9000) -> list[User]:
    """Users nobody allowed."""
    return [User(first_id + index, f"Stranger{index}", "en") for index in range(count)]


# --- 1. /deny stops what is queued --------------------------------------------------------------------------------

async def test_questions_queued_before_a_deny_are_not_answered_after_it(start_bot, telegram_server):
    bot = await start_bot([final(f"answer {n}") for n in range(5)], delay=0.5)
    for n in range(5):
        telegram_server.send_text(ALICE_CHAT, ALICE, f"question {n}")
    await telegram_server.wait_for(lambda: bot.llm.requests, 10, "the first turn to start")

    assert "denied" in await bot.ask(private_chat(ADMIN), ADMIN, f"/deny {ALICE.id}")
    await bot.all_handled(timeout=15)
    await telegram_server.settle()

    # The turn already running finished; the four waiting were refused at their turn's start, with one message.
    assert telegram_server.sent_texts(ALICE.id) == [text("queued", "zh"), "answer 0", refusal(ALICE)]
    assert len(bot.llm.requests) == 1
    assert await bot.query("SELECT question FROM turns") == [("question 0",)]


# --- 2. strangers cost one message each, and never hold anyone up -------------------------------------------------

async def test_a_stranger_is_refused_once_however_often_they_write(start_bot, telegram_server):
    crowd = strangers(5)
    bot = await start_bot([final("for Alice")])
    for round_ in range(20):
        for stranger in crowd:
            chat = private_chat(stranger)
            telegram_server.send_text(chat, stranger, ["/help", "let me in", "/start", "/reset", "/stats"][round_ % 5])
    telegram_server.send_sticker(private_chat(crowd[0]), crowd[0])
    telegram_server.send_text(ALICE_CHAT, ALICE, "a question")

    assert await bot.answers(ALICE.id, 1) == ["for Alice"]
    await bot.all_handled(timeout=20)
    await telegram_server.settle()
    for stranger in crowd:  # one message each (the answer to one of theirs, with the refusal); then nothing
        sent = telegram_server.sent_texts(stranger.id)
        assert len(sent) == 1 and sent[0].endswith(refusal(stranger)), sent
    assert len(telegram_server.sent()) == len(crowd) + 1
    assert bot.llm.requests and len(bot.llm.requests) == 1


async def test_a_refused_sender_is_refused_again_after_the_interval(start_bot, telegram_server):
    bob = strangers(1)[0]
    bot = await start_bot(refusal_interval_seconds=0.5)
    assert await bot.ask(private_chat(bob), bob, "hello?") == refusal(bob)
    telegram_server.send_text(private_chat(bob), bob, "hello??")
    await telegram_server.wait_for(lambda: telegram_server.pending_updates == [], message="the update fetched")
    await bot.all_handled()
    await telegram_server.settle(0.6)  # past the interval
    assert await bot.ask(private_chat(bob), bob, "hello???") == refusal(bob)
    assert telegram_server.sent_texts(bob.id) == [refusal(bob)] * 2


async def test_a_refusal_being_sent_does_not_hold_up_the_next_question_in_the_group(start_bot, telegram_server):
    bob = strangers(1)[0]
    # Telegram takes its time over the refusal; the allowed member asking next must not wait for it.
    telegram_server.fail("sendMessage", status=200, delay=3, times=1,
                         when=lambda params: params["chat_id"] == STRANGERS.id and "/allow" in params["text"])
    bot = await start_bot([final("for Alice")])
    telegram_server.send_text(STRANGERS, bob, "@qwen_test_bot let me in")
    telegram_server.send_text(STRANGERS, ALICE, "@qwen_test_bot a question")

    await bot.answers(STRANGERS.id, 2, timeout=10)
    assert telegram_server.sent_texts(STRANGERS.id) == ["for Alice", refusal(bob)]


async def test_strangers_in_a_group_use_at_most_half_its_budget_and_answers_do_not_wait(start_bot,
                                                                                    telegram_server):
    crowd = strangers(30)
    bot = await start_bot([final("for Alice")])  # the group budget: Telegram's 20 messages per minute
    for stranger in crowd:
        telegram_server.send_text(STRANGERS, stranger, "@qwen_test_bot let me in")
    await telegram_server.wait_for(lambda: telegram_server.pending_updates == [], 10, "the burst to be fetched")
    telegram_server.send_text(STRANGERS, ALICE, "@qwen_test_bot a question")

    # Refusals past half the budget are dropped rather than queued, so the answer finds the budget free: it goes
    # out at once instead of after the 30 refusals (a minute and a half at 20 per minute).
    await telegram_server.wait_for(lambda: "for Alice" in telegram_server.sent_texts(STRANGERS.id), 10,
                                   "Alice's answer")
    await bot.all_handled(timeout=10)
    refused = [t for t in telegram_server.sent_texts(STRANGERS.id) if t != "for Alice"]
    assert 1 <= len(refused) <= 10 and len(set(refused)) == len(refused)  # 10: half of 20, one each


async def test_the_queued_notice_comes_once_per_wait(start_bot, telegram_server):
    bot = await start_bot([final(f"answer {n}") for n in range(6)], delay=0.2)
    for n in range(4):
        telegram_server.send_text(ALICE_CHAT, ALICE, f"question {n}")
    await bot.answers(ALICE.id, 5, timeout=15)
    await bot.all_handled()
    for n in range(4, 6):  # a new wait: the notice again, once
        telegram_server.send_text(ALICE_CHAT, ALICE, f"question {n}")
    await bot.answers(ALICE.id, 8, timeout=15)
    await telegram_server.settle()

    queued = text("queued", "zh")
    assert telegram_server.sent_texts(ALICE.id) == [queued, *(f"answer {n}" for n in range(4)),
                                                    queued, "answer 4", "answer 5"]


# --- 5. a flood wait pauses one chat --------------------------------------------------------------------------------

RETRY_AFTER = 12  # seconds Telegram asks the bot to wait before writing to Alice again


async def test_a_flood_wait_for_one_chat_pauses_that_chat_only(start_bot, telegram_server):
    flood = telegram_server.fail("sendMessage", status=429, retry_after=RETRY_AFTER,
                                 when=lambda params: params["chat_id"] == ALICE.id)
    bot = await start_bot([final("for Alice"), final("for Ada")])
    telegram_server.send_text(ALICE_CHAT, ALICE, "question")
    await telegram_server.wait_for(lambda: flood.times == 0, 10, "Alice's answer to meet the flood wait")

    # Another chat is answered while Alice's waits (before the fix: after it, every chat waited 12 s).
    telegram_server.send_text(private_chat(ADMIN), ADMIN, "question")
    assert await bot.answers(ADMIN.id, 1, timeout=RETRY_AFTER * 2 / 3) == ["for Ada"]
    assert telegram_server.sent_texts(ALICE.id) == []
    assert await bot.answers(ALICE.id, 1, timeout=RETRY_AFTER * 3) == ["for Alice"]
    refused, accepted = telegram_server.calls_to("sendMessage", ok=False)[0], telegram_server.sent(ALICE.id)[0]
    assert accepted.at - refused.at >= RETRY_AFTER  # Alice's chat did wait as long as Telegram asked
    await telegram_server.settle()
    assert telegram_server.sent_texts(ALICE.id) == ["for Alice"]


# --- the caps on one user's questions -------------------------------------------------------------------------------

async def test_questions_past_the_pending_cap_are_dropped_with_one_notice_and_the_rest_answered(start_bot,
                                                                                                  telegram_server):
    bot = await start_bot([final(f"answer {n}") for n in range(5)], delay=0.3, max_pending_questions=3)
    for n in range(7):
        telegram_server.send_text(ALICE_CHAT, ALICE, f"question {n}")
    await bot.answers(ALICE.id, 5, timeout=15)
    await bot.all_handled()
    await telegram_server.settle()

    too_many = text("too_many_pending", "zh", limit=3)
    sent = telegram_server.sent_texts(ALICE.id)
    assert sorted(sent) == sorted([text("queued", "zh"), too_many, "answer 0", "answer 1", "answer 2"])
    assert [t for t in sent if t.startswith("answer")] == ["answer 0", "answer 1", "answer 2"]
    assert await bot.query("SELECT question FROM turns ORDER BY id") == [(f"question {n}",) for n in range(3)]

    assert await bot.ask(ALICE_CHAT, ALICE, "question 3, once they are answered") == "answer 3"  # the cap is per wait


async def test_a_question_over_the_length_cap_gets_a_clear_reply_and_never_reaches_the_model(start_bot,
                                                                                               telegram_server):
    bot = await start_bot([final("fits")], max_question_chars=100)
    assert await bot.ask(ALICE_CHAT, ALICE, "长" * 101) == text("too_long", "zh", length=101, limit=100)
    assert bot.llm.requests == []
    assert await bot.ask(ALICE_CHAT, ALICE, "长" * 100) == "fits"
    assert await bot.query("SELECT count(*) FROM turns") == [(1,)]


# --- the pieces, as plain objects ---------------------------------------------------------------------------------

def test_a_refusal_log_tells_each_sender_once_per_interval_and_forgets_old_entries():
    now = [0.0]
    refusals = RefusalLog(10, clock=lambda: now[0])
    assert refusals.may_tell(1) and not refusals.may_tell(1) and refusals.may_tell(2)
    now[0] = 9.9
    assert not refusals.may_tell(1)
    now[0] = 10.5
    assert refusals.may_tell(1)  # the interval is over
    assert len(refusals) == 1  # and 2, whose interval is over too, is forgotten: a flood of ids does not pile up
    refusals.forget(1)
    assert refusals.may_tell(1)


async def test_the_scheduler_counts_pending_questions_and_gives_each_notice_once_per_wait():
    turns = TurnScheduler()
    first, second = turns.reserve("chat", 1), turns.reserve("chat", 1)
    assert turns.pending(1) == 2 and turns.pending(2) == 0
    assert turns.tell_once(1, "queued") and not turns.tell_once(1, "queued") and turns.tell_once(1, "too_many")
    turns.release(first)
    turns.release(first)  # twice: counted once
    assert turns.pending(1) == 1 and not turns.tell_once(1, "queued")
    turns.release(second)
    assert turns.pending(1) == 0 and not turns._pending and not turns._told  # nothing kept for idle users
    third = turns.reserve("chat", 1)
    assert turns.tell_once(1, "queued")  # a new wait
    turns.release(third)
