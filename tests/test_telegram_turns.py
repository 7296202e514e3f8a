"""The pieces under the handlers, as plain functions: turn order (bot/telegram/turns.py) and group addressing
(bot/telegram/access.py)."""

from __future__ import annotations

import asyncio
import datetime as dt

from telegram import Chat, Message, MessageEntity, User

from bot.telegram.questions import addressed_question
from bot.telegram.turns import BY_SHUTDOWN, TurnScheduler

BOT_ID, BOT_NAME = 777000, "qwen_test_bot"


async def run_all(scheduler: TurnScheduler, plan: list[tuple[str, int]], work: float = 0.01) -> list[int]:
    """Reserve every (session, user) in order, run them concurrently; the order in which turns ran."""
    ran: list[int] = []

    async def turn(index: int, slot) -> None:
        try:
            if await scheduler.wait_turn(slot):
                ran.append(index)
                await asyncio.sleep(work)
        finally:
            scheduler.release(slot)

    slots = [scheduler.reserve(session, user) for session, user in plan]
    await asyncio.wait_for(asyncio.gather(*(turn(i, s) for i, s in enumerate(slots))), 5)
    return ran


async def test_turns_of_a_session_run_in_reservation_order_and_leave_nothing_behind():
    scheduler = TurnScheduler()
    assert await run_all(scheduler, [("chat", 1), ("chat", 2), ("chat", 3)]) == [0, 1, 2]
    assert scheduler.active == 0
    assert not scheduler._session_tail and not scheduler._user_tail  # idle chats and users hold no memory


async def test_crossed_sessions_and_users_do_not_deadlock():
    # Each user talks in two chats, each chat has two users, reserved in an interleaved order.
    plan = [("a", 1), ("b", 2), ("b", 1), ("a", 2), ("a", 1), ("b", 2)]
    ran = await run_all(TurnScheduler(), plan)
    assert sorted(ran) == list(range(len(plan)))
    for session in "ab":
        positions = [ran.index(i) for i, (s, _) in enumerate(plan) if s == session]
        assert positions == sorted(positions)  # in order within each session


async def test_one_user_runs_one_turn_at_a_time_while_other_users_run_in_parallel():
    scheduler = TurnScheduler()
    first, second = scheduler.reserve("p1", 1), scheduler.reserve("g", 1)
    other = scheduler.reserve("p2", 2)
    assert second.behind_own_turn and not first.behind_own_turn and not other.behind_own_turn
    assert await scheduler.wait_turn(first) and await scheduler.wait_turn(other)
    waiting = asyncio.create_task(scheduler.wait_turn(second))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    scheduler.release(first)
    assert await waiting


async def test_a_question_right_after_cancel_is_not_told_it_waits_for_the_cancelled_one():
    # /cancel answers at once, while the stopped turn still winds down (its model call, its trace being stored).
    scheduler = TurnScheduler()
    stopped = scheduler.reserve("p1", 1)
    assert await scheduler.wait_turn(stopped)
    assert scheduler.cancel("p1", 1) == 1
    again = scheduler.reserve("p1", 1)
    assert not again.behind_own_turn
    scheduler.release(stopped)
    assert await scheduler.wait_turn(again)


async def test_a_cancelled_waiting_turn_never_runs_and_shutdown_marks_it_interrupted():
    scheduler = TurnScheduler()
    running = scheduler.reserve("chat", 1, update_id=10)
    queued = scheduler.reserve("chat", 1, update_id=11)
    assert await scheduler.wait_turn(running)
    assert scheduler.cancel("chat", user_id=1) == 2
    assert running.cancel.cancelled
    scheduler.release(running)
    assert await scheduler.wait_turn(queued) is False
    scheduler.release(queued)
    # cancelled by the user: done with, not to be redone
    assert not scheduler.kept_for_restart(10) and not scheduler.kept_for_restart(11)

    stopped = scheduler.reserve("chat", 2, update_id=12)
    assert scheduler.cancel_all() == 1 and stopped.cancelled_by == BY_SHUTDOWN
    scheduler.release(stopped)
    assert scheduler.kept_for_restart(12)


def group_message(text: str, *, entities: list[MessageEntity] = (), reply_to: Message | None = None,
                  chat_type: str = Chat.SUPERGROUP) -> Message:
    chat = Chat(-100, chat_type) if chat_type != Chat.PRIVATE else Chat(5, chat_type)
    return Message(1, dt.datetime.now(dt.timezone.utc), chat, from_user=User(5, "Eve", False), text=text,
                   entities=list(entities), reply_to_message=reply_to)


def mention(text: str, name: str) -> MessageEntity:
    return MessageEntity(MessageEntity.MENTION, text.index(name), len(name))


def test_a_mention_of_the_bot_is_stripped_from_the_question():
    text = "@Qwen_Test_Bot, 大模型技术实战有多少节？"
    assert addressed_question(group_message(text, entities=[mention(text, "@Qwen_Test_Bot")]), BOT_NAME, BOT_ID) == \
        "大模型技术实战有多少节？"
    text = "how many lessons, @qwen_test_bot?"
    assert addressed_question(group_message(text, entities=[mention(text, "@qwen_test_bot")]), BOT_NAME, BOT_ID) == \
        "how many lessons?"
    text = "hey @qwen_test_bot what is 3*2"
    assert addressed_question(group_message(text, entities=[mention(text, "@qwen_test_bot")]), BOT_NAME, BOT_ID) == \
        "hey what is 3*2"


def test_group_messages_not_meant_for_the_bot_are_none():
    text = "ask @other_bot instead"
    assert addressed_question(group_message(text, entities=[mention(text, "@other_bot")]), BOT_NAME, BOT_ID) is None
    assert addressed_question(group_message("@qwen_test_bot written without an entity"), BOT_NAME, BOT_ID) is None
    someone = Message(2, dt.datetime.now(dt.timezone.utc), Chat(-100, Chat.SUPERGROUP),
                      from_user=User(6, "Mallory", False), text="hi")
    assert addressed_question(group_message("a reply to Mallory", reply_to=someone), BOT_NAME, BOT_ID) is None


def test_replies_to_the_bot_and_private_messages_are_questions():
    bots = Message(2, dt.datetime.now(dt.timezone.utc), Chat(-100, Chat.SUPERGROUP),
                   from_user=User(BOT_ID, "Bot", True), text="200")
    assert addressed_question(group_message(" and per week? ", reply_to=bots), BOT_NAME, BOT_ID) == "and per week?"
    assert addressed_question(group_message("hello", chat_type=Chat.PRIVATE), BOT_NAME, BOT_ID) == "hello"
