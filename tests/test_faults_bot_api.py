"""Faults of the Telegram Bot API: flood waits (429 with `retry_after`), bad gateways (502), dropped connections,
slow answers and outages, on `getUpdates` and on `sendMessage`. The bot backs off, retries, and every question
is answered exactly once; the one exception, a send whose *answer* is lost after Telegram carried it out, is
pinned down below as the documented at-least-once case.

Each test scripts the fake server (tests/fakes/telegram_server.py) and asserts on what it received: the status
of every call in order, the gaps between retries, and the accepted messages per chat.
"""

from __future__ import annotations

import time

from tests.fakes.telegram_bot import ALICE, BOB, final, private_chat, start_bot, telegram_server
from tests.fakes.telegram_server import ApiCall, FakeTelegramServer

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

CHAT = private_chat(ALICE)


def gaps(calls: list[ApiCall]) -> list[float]:
    """Seconds between consecutive calls (each recorded when it was answered)."""
    return [later.at - earlier.at for earlier, later in zip(calls, calls[1:])]


def confirming(params: dict) -> bool:
    """A poll that carries an offset: the one that tells Telegram the previous batch arrived."""
    return bool(params.get("offset"))


def confirmations(server: FakeTelegramServer) -> list[ApiCall]:
    """The polls that carried an offset, as recorded (when they answered)."""
    return [c for c in server.calls_to("getUpdates") if confirming(c.params)]


async def answered_once(server: FakeTelegramServer, chat_id: int, expected: list[str]) -> None:
    """Wait until the bot is idle; its accepted messages in `chat_id` are exactly `expected`."""
    await server.settle()
    assert server.sent_texts(chat_id) == expected


# --- getUpdates ------------------------------------------------------------------------------------------------

async def test_a_flood_wait_on_get_updates_is_waited_out_then_the_question_is_answered_once(start_bot,
                                                                                             telegram_server):
    telegram_server.send_text(CHAT, ALICE, "question")  # waiting before the bot even starts
    telegram_server.fail("getUpdates", status=429, retry_after=1)
    bot = await start_bot([final("answer")])

    assert await bot.answers(ALICE.id, 1) == ["answer"]
    polls = telegram_server.calls_to("getUpdates")
    assert [call.status for call in polls[:2]] == [429, 200]
    assert gaps(polls)[0] >= 0.95  # it waited what Telegram asked for
    await answered_once(telegram_server, ALICE.id, ["answer"])
    assert await bot.query("SELECT count(*) FROM turns") == [(1,)]


async def test_bad_gateway_and_a_dropped_poll_back_off_longer_each_time_and_lose_no_update(start_bot,
                                                                                           telegram_server):
    bot = await start_bot([final("one"), final("two")])
    # The poll that would confirm the first question fails twice: Telegram keeps that question queued meanwhile.
    telegram_server.fail("getUpdates", status=502, when=confirming)
    telegram_server.fail("getUpdates", drop=True, when=confirming)
    assert await bot.ask(CHAT, ALICE, "first") == "one"
    telegram_server.send_text(CHAT, ALICE, "second")  # arrives during the failures
    assert await bot.answers(ALICE.id, 2) == ["one", "two"]

    # After a failure the poller fetches once without an offset (bot/telegram/intake.py), so the confirmation that
    # succeeds may be a long poll, recorded only when it answers.
    await telegram_server.wait_for(lambda: len(confirmations(telegram_server)) >= 3, 5, "the third confirmation")
    confirms = confirmations(telegram_server)
    assert [c.status for c in confirms[:3]] == [502, 0, 200]
    first_pause, second_pause = gaps(confirms[:3])
    assert 0.45 <= first_pause < second_pause  # 0.5 s, then 1 s: the back-off grows
    await answered_once(telegram_server, ALICE.id, ["one", "two"])
    assert telegram_server.pending_updates == []
    assert await bot.query("SELECT question FROM turns ORDER BY id") == [("first",), ("second",)]


async def test_a_slow_poll_answered_within_its_time_out_delivers_its_updates_once(start_bot, telegram_server):
    telegram_server.send_text(CHAT, ALICE, "question")
    telegram_server.fail("getUpdates", status=200, applied=True, delay=1.5)  # the batch leaves, 1.5 s late
    started = time.monotonic()
    bot = await start_bot([final("answer")])

    assert await bot.answers(ALICE.id, 1) == ["answer"]
    assert time.monotonic() - started >= 1.5
    assert telegram_server.statuses("getUpdates")[0] == 200
    await answered_once(telegram_server, ALICE.id, ["answer"])


async def test_a_poll_whose_answer_comes_after_the_time_out_is_fetched_again_not_lost(start_bot, telegram_server):
    """PTB gives a long poll `timeout` + 5 s (6 s here); the fake answers after 7 s, to a client that has gone.

    The update was never confirmed by an offset, so the next poll gets it again. About 7 s.
    """
    telegram_server.send_text(CHAT, ALICE, "question")
    telegram_server.fail("getUpdates", status=200, applied=True, delay=7)
    bot = await start_bot([final("answer")])

    assert await bot.answers(ALICE.id, 1, timeout=12) == ["answer"]
    await answered_once(telegram_server, ALICE.id, ["answer"])
    assert await bot.query("SELECT count(*) FROM turns") == [(1,)]


# --- sendMessage -----------------------------------------------------------------------------------------------

async def test_a_dropped_send_a_bad_gateway_and_a_slow_send_still_deliver_the_answer_once(start_bot,
                                                                                          telegram_server):
    telegram_server.fail("sendMessage", drop=True)  # the request never reached Telegram
    telegram_server.fail("sendMessage", status=502)
    telegram_server.fail("sendMessage", status=200, delay=1)  # slow, but well within PTB's 5 s read time-out
    bot = await start_bot([final("answer")])

    assert await bot.ask(CHAT, ALICE, "question") == "answer"
    await answered_once(telegram_server, ALICE.id, ["answer"])
    assert telegram_server.statuses("sendMessage") == [0, 502, 200]
    assert await bot.query("SELECT count(*) FROM turns") == [(1,)]


async def test_flood_waits_on_send_are_honoured_every_time_and_the_answer_arrives_once(start_bot, telegram_server):
    # Three in a row: PTB's rate limiter retries twice itself, then the bot's own retry takes over. About 3 s.
    telegram_server.fail("sendMessage", status=429, retry_after=1, times=3)
    bot = await start_bot([final("answer")])

    assert await bot.ask(CHAT, ALICE, "question") == "answer"
    await answered_once(telegram_server, ALICE.id, ["answer"])
    sends = telegram_server.calls_to("sendMessage")
    assert [c.status for c in sends] == [429, 429, 429, 200]
    assert all(pause >= 0.95 for pause in gaps(sends))


async def test_an_answer_sent_during_a_telegram_outage_of_a_few_seconds_arrives_once_it_is_over(start_bot,
                                                                                                  telegram_server):
    bot = await start_bot([final("answer")])
    telegram_server.fail("sendMessage", status=502, for_seconds=4)
    started = time.monotonic()
    telegram_server.send_text(CHAT, ALICE, "question")

    assert await bot.answers(ALICE.id, 1, timeout=15) == ["answer"]
    assert time.monotonic() - started >= 4
    await answered_once(telegram_server, ALICE.id, ["answer"])
    await bot.all_handled()


async def test_a_send_whose_answer_is_lost_is_sent_again_the_documented_at_least_once(start_bot, telegram_server):
    """Telegram carried the send out, but its answer never came back (a dropped connection; a read time-out is
    the same case). The Bot API has no idempotency key, so the bot cannot know: it retries, and the user sees
    the answer twice. Retrying is the right side to err on: not retrying would lose answers whose *request*
    failed. The turn itself is stored once."""
    telegram_server.fail("sendMessage", status=200, applied=True, drop=True)
    bot = await start_bot([final("answer")])

    telegram_server.send_text(CHAT, ALICE, "question")
    await bot.answers(ALICE.id, 2)
    await answered_once(telegram_server, ALICE.id, ["answer", "answer"])
    assert await bot.query("SELECT count(*) FROM turns") == [(1,)]


async def test_failures_in_one_chat_do_not_hold_up_another(start_bot, telegram_server):
    # Alice's chat fails until Bob is answered: Bob's answer comes while Alice's is still being retried, however
    # slow the machine (an outage of a fixed length could end before a loaded machine got to either).
    outage = telegram_server.fail("sendMessage", status=502, times=-1, when=lambda p: p["chat_id"] == ALICE.id)
    bot = await start_bot([final("for alice"), final("for bob")], allowed_user_ids=frozenset({ALICE.id, BOB.id}))
    telegram_server.send_text(CHAT, ALICE, "question")
    await telegram_server.wait_for(lambda: telegram_server.calls_to("sendMessage", ok=False), 10)

    assert await bot.ask(private_chat(BOB), BOB, "question") == "for bob"
    assert telegram_server.sent_texts(ALICE.id) == []  # still failing: Bob did not wait for it
    outage.stop()
    assert await bot.answers(ALICE.id, 1, timeout=20) == ["for alice"]
    await answered_once(telegram_server, BOB.id, ["for bob"])


async def test_an_answer_telegram_never_takes_is_sent_from_the_store_after_a_restart(start_bot, telegram_server):
    outage = telegram_server.fail("sendMessage", status=502, times=-1)
    # 1 s of patience instead of 30; the resend while running (tests/test_holes_delivery.py) is not due before the stop
    first = await start_bot([final("stored answer")], send_patience_seconds=1.0, answer_resend_seconds=3600)
    telegram_server.send_text(CHAT, ALICE, "question")
    await telegram_server.wait_for(lambda: len(telegram_server.calls_to("sendMessage")) >= 2, 10,
                                   "the first try to give up")
    await first.stop()
    assert telegram_server.sent_texts(ALICE.id) == []
    assert await first.query("SELECT update_id FROM telegram_updates WHERE handled_at IS NULL") == [(1,)]

    outage.stop()
    second = await start_bot()
    assert await second.answers(ALICE.id, 1) == ["stored answer"]
    assert second.llm.requests == []  # from the store, not asked again
    await answered_once(telegram_server, ALICE.id, ["stored answer"])
    await second.all_handled()
