"""The question path: whether a message is meant for the bot, its place in line, access at the start of its
turn, running the agent with feedback, and delivering the answer.

Questions go through the turn scheduler (bot/telegram/turns.py): in order per chat, one at a time per user.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from datetime import timedelta

from telegram import Message, MessageEntity, Update, User
from telegram.error import BadRequest, NetworkError, RetryAfter

from agent.errors import LLMCancelled, LLMError, LLMTimeout
from agent.events import AnswerText, EventSink, ToolStarted
from agent.memory import Session
from bot.program.config import Settings
from bot.telegram.chat import is_group, may_talk, refuse, reply, session_for, topic_of, user_language
from bot.telegram.context import BotContext
from bot.telegram.i18n import text
from bot.telegram.quotas import QuotaState
from bot.telegram.replies import TurnFeedback, quietly
from bot.telegram.streaming import AnswerStream, StreamTarget
from bot.telegram.turns import BY_SHUTDOWN, BY_USER, TurnSlot
from db import DatabaseBusy

log = logging.getLogger(__name__)


async def answer_question(update: Update, context: BotContext, question: str) -> None:
    """Take the question's place in line, check access, wait for its turn, check access again, run it and reply.

    Nobody waits behind a refusal or a usage message: a question leaves the line before anything is said about it.
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
        if (problem := question_problem(question, context.settings, user_language(update))) is not None:
            turns.release(slot)
            await reply(message, problem)
            return
        await take_turn(update, context, question, slot)
    finally:
        turns.release(slot)


async def take_turn(update: Update, context: BotContext, question: str, slot: TurnSlot) -> None:
    """Wait for the slot's turn; run it if the sender still has access then (an admin may /deny meanwhile)."""
    message, user, lang = update.effective_message, update.effective_user, user_language(update)
    if slot.behind_own_turn and context.turns.tell_once(user.id, "queued"):
        await quietly(reply(message, text("queued", lang)), "the queued notice")
    if not await context.turns.wait_turn(slot):
        return
    if not await may_talk(update, context):
        context.turns.release(slot)
        await refuse(update, context)
        return
    if not context.access.is_admin(user.id) and (used_up := await context.quotas.exhausted(user.id)) is not None:
        context.turns.release(slot)
        await refuse_over_quota(context, message, user.id, used_up, lang)
        return
    prompt = f"{asker_name(user)}: {question}" if is_group(message) else question
    await run_turn(context, message, session_for(message), prompt, slot, lang)


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


async def run_turn(context: BotContext, message: Message, session: Session, question: str, slot: TurnSlot,
                   lang: str) -> None:
    """Run the agent with typing, progress and the answer streamed as it is written; deliver the answer (or a
    short apology) over the stream; a stopped turn leaves what was streamed, marked as stopped."""
    feedback = TurnFeedback(context.bot, message.chat_id, placeholder=text("thinking", lang),
                            reply_to=message.message_id, thread_id=topic_of(message),
                            typing_every=context.settings.streaming.typing_interval_seconds,
                            progress_after=context.settings.streaming.progress_after_seconds, ledger=context.progress)
    stream = answer_stream(context, message)
    try:
        try:
            async with feedback, stream:
                answer = await agent_answer(context, session, question, slot, lang, turn_events(feedback, stream))
        except BaseException:  # a bug (the error handler apologises) or the task cancelled: what streamed is cut
            await stream.stop(text("answer_stopped", lang))
            raise
        if answer is None:
            await stream.stop(text("answer_stopped", lang))
        else:
            await deliver(context, stream, answer, slot)
    finally:
        await feedback.remove()  # the answer (or the apology of the error handler) replaces it


def answer_stream(context: BotContext, message: Message) -> AnswerStream:
    """Where the answer streams: a draft in a private chat, else one message edited, at the chat's pace."""
    group = is_group(message)
    target = StreamTarget(message.chat_id, reply_to=message.message_id, thread_id=topic_of(message),
                          draft_id=None if group else message.message_id)
    streaming = context.settings.streaming
    interval = streaming.group_stream_interval_seconds if group else streaming.stream_interval_seconds
    return AnswerStream(context.bot, target, interval=interval, drafts=context.drafts,
                        patience=context.settings.turns.send_patience_seconds)


def turn_events(feedback: TurnFeedback, stream: AnswerStream) -> EventSink:
    """What the user sees of a running turn: the tool at work on the progress line, the answer as it grows."""
    def on_event(event: object) -> None:
        if isinstance(event, ToolStarted):
            shown = event.shown_input
            feedback.show(f"{event.label}: {shown[:60]}…" if shown else f"{event.label}…")
        elif isinstance(event, AnswerText):
            stream.show(event.text)
    return on_event


async def deliver(context: BotContext, stream: AnswerStream, answer: str, slot: TurnSlot) -> None:
    """Send the answer; if Telegram refuses it for longer than SEND_PATIENCE_SECONDS, have it sent again."""
    try:
        await stream.finish(answer)
    except BadRequest:
        raise  # refused for good (PTB's BadRequest is a NetworkError): sending it again would fail again
    except (NetworkError, RetryAfter) as error:
        # The turn is stored already: its update stays unhandled in the journal and is handled again, answered
        # from the store, after ANSWER_RESEND_SECONDS (or after a restart): bot/telegram/intake.py. No apology:
        # the answer itself is on its way.
        log.warning("the answer to update %s was not delivered (%s); it will be sent again", slot.update_id, error)
        context.turns.keep_undelivered(slot)
        return
    slot.answered = True


async def agent_answer(context: BotContext, session: Session, question: str, slot: TurnSlot, lang: str,
                       on_event: EventSink) -> str | None:
    """The agent's answer, an apology when the model failed, or None when the turn was cancelled."""
    if slot.source_key and (stored := await context.services.memory.stored_answer(slot.source_key)) is not None:
        return stored  # a redelivered update (restart): answer it again, do not store it twice
    try:
        result = await context.services.agent.run(session, question, user_id=slot.user_id,
                                                  source_key=slot.source_key,
                                                  on_event=on_event, cancel=slot.cancel)
    except LLMTimeout:
        return text("timeout", lang)
    except LLMCancelled:
        # /cancel already said "stopped"; a turn stopped by shutdown stays unhandled in the update journal and is
        # answered after the restart (bot/telegram/intake.py).
        return None if slot.cancelled_by in (BY_USER, BY_SHUTDOWN) else text("timeout", lang)
    except LLMError as error:
        log.warning("model failed in %s: %s", session.id, error)
        return text("model_error", lang)
    except DatabaseBusy as error:
        # Another process held the write lock past DATABASE_BUSY_TIMEOUT_SECONDS: nothing of the turn was stored.
        log.warning("database busy in %s: %s", session.id, error)
        return text("busy", lang)
    return result.answer


def is_blank(question: str) -> bool:
    """Whether a question shows nothing: only spaces and invisible marks (zero-width, text direction)."""
    return all(char.isspace() or unicodedata.category(char) in ("Cf", "Cc", "Zs") for char in question)


def asker_name(user: User) -> str:
    """How a group question is attributed to its asker, for the model."""
    return user.full_name or (f"@{user.username}" if user.username else str(user.id))


# --- addressing: is a message meant for the bot? ---------------------------------------------------------------

def addressed_question(message: Message, bot_username: str, bot_id: int) -> str | None:
    """The question in a text message meant for the bot, mention stripped; None when not meant for it.

    In a private chat every message is meant for the bot. In a group it must mention `@bot_username` or reply
    to one of the bot's messages (`/ask` is its own command handler).
    """
    text = message.text or ""
    if not is_group(message):
        return text.strip()
    mention = _mention_of(message, bot_username)
    if mention is not None:
        return _strip_span(text, mention)
    replied = message.reply_to_message
    if replied is not None and replied.from_user is not None and replied.from_user.id == bot_id:
        return text.strip()
    return None


def _mention_of(message: Message, bot_username: str) -> tuple[int, int] | None:
    """(start, end) in Python indices of the first @bot_username mention, from Telegram's entities."""
    wanted = "@" + bot_username.lower()
    for entity, value in message.parse_entities([MessageEntity.MENTION]).items():
        if value.lower() == wanted:
            start = (message.text or "").find(value)
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
