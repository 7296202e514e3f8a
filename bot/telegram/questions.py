"""The question path: whether a message is meant for the bot, its place in line, access at the start of its
turn, running the agent with feedback, and delivering the answer.

Questions go through the turn scheduler (bot/telegram/turns.py): in order per chat, one at a time per user. A turn
keeps its place until its answer is delivered, so answers reach each chat in the order of the questions even when
Telegram refuses them for a while (`deliver`). An update handled again (a restart) is answered from the store, and
only the pieces of the answer Telegram has not taken yet are sent (bot/telegram/deliveries.py).

A question asked by voice or about a picture comes with an `Attachment` (bot/telegram/media.py), which turns it
into the question (`Asked`: a transcript, a picture) at its place in line, once access is granted: from there on it
is a question like any typed one.
"""

from __future__ import annotations

import asyncio
import logging
import re
import unicodedata
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Awaitable, Callable, Protocol

from telegram import Message, MessageEntity, Update, User
from telegram.error import BadRequest, NetworkError, RetryAfter

from agent.errors import ImagesRefused, LLMCancelled, LLMError, LLMTimeout, TurnNotSaved
from agent.events import AnswerText, EventSink, ToolStarted
from agent.images import Picture
from agent.memory import Session
from bot.program.config import Settings
from bot.program.doc_reports import with_sources
from bot.program.metrics import TurnTimer
from bot.telegram.chat import is_group, may_talk, refuse, reply, session_for, topic_of, user_language
from bot.telegram.context import BotContext
from bot.telegram.i18n import text
from bot.telegram.quotas import QuotaState
from bot.telegram.replies import TurnFeedback, quietly, split_message
from bot.telegram.streaming import AnswerStream, StreamTarget
from bot.telegram.turns import BY_DATABASE_GONE, BY_SHUTDOWN, BY_USER, TurnSlot
from db import DatabaseBusy

log = logging.getLogger(__name__)

SAVE_RETRY_SECONDS = 1.0  # between two tries to store a turn whose first save met a busy database


@dataclass(frozen=True)
class Asked:
    """A question ready for its turn: its text, the pictures that go with it, how it was asked ('text', 'voice',
    'photo': agent/memory.py), and a `lead` shown before its answer (a private chat's transcript)."""

    text: str
    pictures: tuple[Picture, ...] = ()
    input_kind: str = "text"
    lead: str = ""


class Attachment(Protocol):
    """What came with a question (a recording, a picture): made into the question at its place in line."""

    async def prepare(self, update: Update, context: BotContext, question: str) -> Asked | None:
        """The question `Asked` with the attachment (fetched, transcribed, shrunk), given the text that came with
        it; None when the user was told why there is none (too long, unreadable, a model that cannot see)."""


async def answer_question(update: Update, context: BotContext, question: str,
                          attachment: Attachment | None = None) -> None:
    """Take the question's place in line, check access, wait for its turn, check access again, run it and reply.

    Nobody waits behind a refusal or a usage message: a question leaves the line before anything is said about it.
    An `attachment` is fetched and made into the question after the access check, still in line.
    """
    message, user = update.effective_message, update.effective_user
    if user is None:
        return
    turns = context.turns
    if turns.pending(user.id) >= context.settings.turns.max_pending_questions:
        await turn_away(update, context)  # over the cap: dropped before it takes a place in line
        return
    # The place in line is taken before the first await, so turns keep the order the updates came in.
    slot = turns.reserve(session_for(message).id, user.id, update.update_id)
    try:
        if not await may_talk(update, context):
            turns.release(slot)
            await refuse(update, context)
            return
        asked = Asked(question) if attachment is None else await attachment.prepare(update, context, question)
        if asked is None:
            turns.release(slot)
            return
        if (problem := question_problem(asked.text, context.settings, user_language(update))) is not None:
            turns.release(slot)
            await reply(message, problem)
            return
        await take_turn(update, context, asked, slot)
    finally:
        turns.release(slot)


async def take_turn(update: Update, context: BotContext, asked: Asked, slot: TurnSlot) -> None:
    """Wait for the slot's turn; run it if the sender still has access then (an admin may /deny meanwhile)."""
    message, user, lang = update.effective_message, update.effective_user, user_language(update)
    if slot.behind_own_turn and context.turns.tell_once(user.id, "queued"):
        await quietly(reply(message, text("queued", lang)), "the queued notice")
    await _take_turn(update, context, asked, slot)
    if slot.cancelled_by == BY_DATABASE_GONE and not slot.answered:
        # The bot stops: its journal went with the database, so no restart will answer this question either.
        # (A turn that met the loss itself raises DatabaseGone, and the error handler says the same.)
        await quietly(reply(message, text("database_gone", lang)), "the stopping notice")


async def _take_turn(update: Update, context: BotContext, asked: Asked, slot: TurnSlot) -> None:
    message, user, lang = update.effective_message, update.effective_user, user_language(update)
    if not await context.turns.wait_turn(slot):
        return
    if not await may_talk(update, context):
        context.turns.release(slot)
        await refuse(update, context)
        return
    stored = await stored_reply(context, slot, asked.lead)
    if stored is not None and stored.already >= len(split_message(stored.text) or ["…"]):
        log.info("update %s: its stored answer went out before the restart; not sent again", slot.update_id)
        slot.answered = True
        return
    if stored is None and not context.access.is_admin(user.id) \
            and (used_up := await context.quotas.exhausted(user.id)) is not None:
        context.turns.release(slot)
        await refuse_over_quota(context, message, user.id, used_up, lang)
        return
    prompt = f"{asker_name(user)}: {asked.text}" if is_group(message) else asked.text
    await run_turn(context, message, session_for(message), replace(asked, text=prompt), slot, lang, stored)


async def turn_away(update: Update, context: BotContext) -> None:
    """A question over MAX_PENDING_QUESTIONS: the sender is told once per wait, and the question is dropped."""
    user = update.effective_user
    if not await may_talk(update, context):
        await refuse(update, context)
        return
    log.debug("update %s: user %s has %d questions pending; dropped", update.update_id, user.id,
             context.turns.pending(user.id))
    if context.turns.pending(user.id) and context.turns.tell_once(user.id, "too_many"):
        await quietly(reply(update.effective_message, text("too_many_pending", user_language(update),
                                                           limit=context.settings.turns.max_pending_questions)),
                      "the too-many-questions notice")


async def refuse_over_quota(context: BotContext, message: Message, user_id: int, used_up: QuotaState,
                            lang: str) -> None:
    """A question past the user's daily quota: why and when to ask again, said once a day; then nothing."""
    if not context.quotas.tell_once(user_id):
        log.debug("user %s is over their daily %s quota; question dropped quietly", user_id, used_up.kind)
        return
    window = context.quotas.window()
    await quietly(reply(message, text(f"quota_refused_{used_up.kind}", lang, limit=used_up.limit,
                                      reset=window.reset.strftime("%H:%M"),
                                      wait=duration_text(window.until_reset(context.quotas.clock()), lang))),
                  "the quota notice")


def duration_text(left: timedelta, lang: str) -> str:
    """A wait in hours and minutes, in `lang` (rounded up to the minute)."""
    minutes = -(-int(left.total_seconds()) // 60)
    return text("duration", lang, hours=minutes // 60, minutes=minutes % 60)


def question_problem(question: str, settings: Settings, lang: str) -> str | None:
    """What is wrong with a question the bot will not ask the model (blank, too long); None when it is fine."""
    if is_blank(question):
        return text("ask_usage", lang)
    if len(question) > settings.turns.max_question_chars:
        return text("too_long", lang, length=len(question), limit=settings.turns.max_question_chars)
    return None


@dataclass(frozen=True)
class TurnAnswer:
    """What a turn delivers: the text, what an earlier run already did with it, and what is still to store."""

    text: str
    already: int = 0  # leading pieces an earlier run delivered (an answer from the store, after a restart)
    save: Callable[[], Awaitable[int]] | None = None  # stores the turn when its first save met a busy database


async def stored_reply(context: BotContext, slot: TurnSlot, lead: str = "") -> TurnAnswer | None:
    """The answer stored for the slot's update (handled again after a restart), after the question's `lead` as it
    was delivered the first time, with how much of it went out."""
    if not slot.source_key:
        return None
    stored = await context.services.memory.stored_answer(slot.source_key)
    if stored is None:
        return None
    return TurnAnswer(led(lead, stored), await context.deliveries.delivered(slot.source_key))


async def run_turn(context: BotContext, message: Message, session: Session, asked: Asked, slot: TurnSlot,
                   lang: str, stored: TurnAnswer | None = None) -> None:
    """Run the agent (or take the `stored` answer) with typing, progress and the answer streamed as it is written;
    deliver the answer (or a short apology) over the stream, after the question's lead (a transcript); a stopped
    turn leaves what was streamed, marked as stopped."""
    feedback = TurnFeedback(context.bot, message.chat_id, placeholder=text("thinking", lang),
                            reply_to=message.message_id, thread_id=topic_of(message),
                            typing_every=context.settings.streaming.typing_interval_seconds,
                            progress_after=context.settings.streaming.progress_after_seconds, ledger=context.progress)
    stream = answer_stream(context, message, slot)
    timer = context.metrics.timer()
    if stored is not None:
        timer.status = None  # an answer sent again from the store: not a turn of its own
    try:
        try:
            async with feedback, stream:
                if asked.lead and stored is None:
                    stream.show(asked.lead)  # what was understood, before the answer is there
                answer = stored or with_lead(asked.lead, await agent_answer(
                    context, session, asked, slot, lang, turn_events(feedback, stream, asked.lead), timer))
        except BaseException:  # a bug (the error handler apologises) or the task cancelled: what streamed is cut
            await stream.stop(text("answer_stopped", lang))
            raise
        if answer is None:
            await stream.stop(text("answer_stopped", lang))
        else:
            await deliver(context, stream, answer, slot)
            if answer.save is not None:
                await save_later(context, answer.save, slot)
    finally:
        await feedback.remove()  # the answer (or the apology of the error handler) replaces it
        timer.end(stream.first_shown)


def answer_stream(context: BotContext, message: Message, slot: TurnSlot) -> AnswerStream:
    """Where the answer streams: a draft in a private chat, else one message edited, at the chat's pace; each
    piece Telegram takes is recorded under the turn's key."""
    group = is_group(message)
    target = StreamTarget(message.chat_id, reply_to=message.message_id, thread_id=topic_of(message),
                          draft_id=None if group else message.message_id)
    streaming = context.settings.streaming
    interval = streaming.group_stream_interval_seconds if group else streaming.stream_interval_seconds
    recorder = context.deliveries.recorder(slot.source_key) if slot.source_key else None
    return AnswerStream(context.bot, target, interval=interval, drafts=context.drafts,
                        patience=context.settings.turns.send_patience_seconds, on_delivered=recorder)


def turn_events(feedback: TurnFeedback, stream: AnswerStream, lead: str = "") -> EventSink:
    """What the user sees of a running turn: the tool at work on the progress line, the answer as it grows (after
    the question's `lead`)."""
    def on_event(event: object) -> None:
        if isinstance(event, ToolStarted):
            shown = event.shown_input
            feedback.show(f"{event.label}: {shown[:60]}…" if shown else f"{event.label}…")
        elif isinstance(event, AnswerText):
            stream.show(led(lead, event.text))
    return on_event


def led(lead: str, answer: str) -> str:
    """The answer after its lead (a transcript), a blank line between; the answer alone when there is none."""
    return f"{lead}\n\n{answer}" if lead and answer else lead or answer


def with_lead(lead: str, answer: TurnAnswer | None) -> TurnAnswer | None:
    """The turn's answer after the question's lead (None stays None: the turn was stopped)."""
    return replace(answer, text=led(lead, answer.text)) if answer is not None and lead else answer


async def deliver(context: BotContext, stream: AnswerStream, answer: TurnAnswer, slot: TurnSlot) -> None:
    """Send the answer, trying until Telegram takes it.

    Each try retries for SEND_PATIENCE_SECONDS (network failures, flood waits); the next one starts
    ANSWER_RESEND_SECONDS later, and goes on where the last stopped (no piece is sent twice). All the while the
    turn keeps its place, so the chat's next answer cannot overtake this one, and it goes out as soon as Telegram
    takes messages again, without a restart. /cancel stops the tries; so does a shutdown, which leaves the update
    unhandled for the next start to send from the store. A refusal (BadRequest) is final: sending it again would
    be refused again.
    """
    resend = context.settings.turns.answer_resend_seconds
    while True:
        try:
            finished = await until_stopped(stream.finish(answer.text, already=answer.already), slot)
        except BadRequest:
            raise  # refused for good (PTB's BadRequest is a NetworkError)
        except (NetworkError, RetryAfter) as error:
            log.warning("the answer to update %s was not delivered yet (%s); trying again in %g s", slot.update_id,
                        error, resend)
            if await until_stopped(asyncio.sleep(resend), slot):
                continue
            finished = False
        if finished:
            slot.answered = True
        else:
            log.info("update %s: delivering its answer stopped (%s)", slot.update_id, slot.cancelled_by)
        return


async def until_stopped(work: Awaitable[object], slot: TurnSlot) -> bool:
    """Await `work` unless the slot is stopped first (/cancel, shutdown): then cancel it. Whether it completed."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.create_task(slot.stopped.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        return False
    task.result()  # raises what the work raised
    return True


async def agent_answer(context: BotContext, session: Session, asked: Asked, slot: TurnSlot, lang: str,
                       on_event: EventSink, timer: TurnTimer) -> TurnAnswer | None:
    """The agent's answer, an apology when the model failed, or None when the turn was cancelled; `timer` learns
    how the turn ended."""
    try:
        result = await context.services.agent.run(session, asked.text, user_id=slot.user_id,
                                                  source_key=slot.source_key, on_event=on_event, cancel=slot.cancel,
                                                  pictures=asked.pictures, input_kind=asked.input_kind)
    except ImagesRefused as error:  # OPENAI_VISION=auto found out: the model reads text only
        timer.status = "error"
        log.info("model refused the picture in %s: %s", session.id, error)
        return TurnAnswer(text("text_only_model", lang))
    except LLMTimeout:
        timer.status = "timeout"
        return TurnAnswer(text("timeout", lang))
    except LLMCancelled:
        timer.status = "cancelled"
        # /cancel already said "stopped"; a turn stopped by shutdown stays unhandled in the update journal and is
        # answered after the restart (bot/telegram/intake.py).
        stopped = slot.cancelled_by in (BY_USER, BY_SHUTDOWN, BY_DATABASE_GONE)
        return None if stopped else TurnAnswer(text("timeout", lang))
    except LLMError as error:
        timer.status = "error"
        log.warning("model failed in %s: %s", session.id, error)
        return TurnAnswer(text("model_error", lang))
    except TurnNotSaved as unsaved:
        # The answer exists; only storing it met another process's lock. The user gets it now; it is stored
        # once the database frees (`save_later`).
        log.warning("database busy in %s as the turn was stored (%s): delivering the answer first", session.id,
                    unsaved)
        timer.status = str(unsaved.result.status)
        context.metrics.tools_used(unsaved.result)
        return TurnAnswer(await with_sources(context.services.documents, unsaved.result, lang), save=unsaved.save)
    except DatabaseBusy as error:
        # Another process held the write lock past DATABASE_BUSY_TIMEOUT_SECONDS before the turn had an answer.
        timer.status = "database_busy"
        log.warning("database busy in %s: %s", session.id, error)
        return TurnAnswer(text("busy", lang))
    timer.status = str(result.status)
    context.metrics.tools_used(result)
    return TurnAnswer(await with_sources(context.services.documents, result, lang))  # the documents it used


async def save_later(context: BotContext, save: Callable[[], Awaitable[int]], slot: TurnSlot) -> None:
    """Store a delivered turn whose first save met a busy database: try again, a second apart (each try waits
    DATABASE_BUSY_TIMEOUT_SECONDS for the lock), for up to ANSWER_SAVE_WAIT_SECONDS. The turn keeps its place
    meanwhile, so the chat's next question sees it in its history. Giving up is logged: the answer was delivered
    but is missing from the history (and a restart before its update is marked handled would ask again)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + context.settings.turns.answer_save_wait_seconds
    while True:
        try:
            await save()
            log.info("update %s: its turn is stored now that the database is free", slot.update_id)
            return
        except DatabaseBusy as error:
            if loop.time() + SAVE_RETRY_SECONDS > deadline:
                log.error("update %s: its answer was delivered but could not be stored; the database stayed busy "
                          "for %g s (%s)", slot.update_id, context.settings.turns.answer_save_wait_seconds, error)
                return
        if not await until_stopped(asyncio.sleep(SAVE_RETRY_SECONDS), slot):
            return


def is_blank(question: str) -> bool:
    """Whether a question shows nothing: only spaces and invisible marks (zero-width, text direction)."""
    return all(char.isspace() or unicodedata.category(char) in ("Cf", "Cc", "Zs") for char in question)


def asker_name(user: User) -> str:
    """How a group question is attributed to its asker, for the model."""
    return user.full_name or (f"@{user.username}" if user.username else str(user.id))


# --- addressing: is a message meant for the bot? ---------------------------------------------------------------

def addressed_question(message: Message, bot_username: str, bot_id: int, *, caption: bool = False) -> str | None:
    """The question in a text message meant for the bot, mention stripped; None when not meant for it. With
    `caption`, the question in a media message's caption (a voice note's, a photo's), '' when it has none.

    In a private chat every message is meant for the bot. In a group it must mention `@bot_username` or reply
    to one of the bot's messages (`/ask` is its own command handler).
    """
    text = (message.caption if caption else message.text) or ""
    if not is_group(message):
        return text.strip()
    entities = message.parse_caption_entities if caption else message.parse_entities
    mention = _mention_of(text, entities([MessageEntity.MENTION]), bot_username)
    if mention is not None:
        return _strip_span(text, mention)
    replied = message.reply_to_message
    if replied is not None and replied.from_user is not None and replied.from_user.id == bot_id:
        return text.strip()
    return None


def _mention_of(text: str, mentions: dict[MessageEntity, str], bot_username: str) -> tuple[int, int] | None:
    """(start, end) in Python indices of the first @bot_username mention in `text`, from Telegram's entities."""
    wanted = "@" + bot_username.lower()
    for value in mentions.values():
        if value.lower() == wanted:
            start = text.find(value)
            return start, start + len(value)
    return None


def _strip_span(text: str, span: tuple[int, int]) -> str:
    """Text without the span, with the commas and spaces that went with it tidied ("x, @bot?" → "x?")."""
    left = text[:span[0]].rstrip().rstrip(",，:：").rstrip()
    right = text[span[1]:].lstrip(" ,，:：")
    if not left or not right:
        return (left or right).strip()
    separator = "" if right[0] in "?!.。？！，,;；" else " "
    return re.sub(r"\s{2,}", " ", left + separator + right).strip()
