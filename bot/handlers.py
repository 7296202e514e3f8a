"""User handlers: questions (private chats, and group messages addressed to the bot) and the user commands.

Each handler is thin: it reads the update, checks access, then calls the agent or a store and replies.
Questions go through the turn scheduler (bot/turns.py): in order per chat, one at a time per user.
"""

from __future__ import annotations

import logging
import sqlite3
import unicodedata

from telegram import Message, Update, User
from telegram.error import Forbidden, NetworkError, RetryAfter

from agent.errors import LLMCancelled, LLMError, LLMTimeout
from agent.memory import Session, StoredTurn
from bot.access import addressed_question, is_group
from bot.context import BotContext
from bot.i18n import language, text
from bot.replies import TurnFeedback, quietly, send_text
from bot.turns import BY_SHUTDOWN, BY_USER, TurnSlot

log = logging.getLogger(__name__)

TRACE_TEXT_CHARS = 300


# --- sessions and replies --------------------------------------------------------------------------------------

def session_for(message: Message) -> Session:
    """The history a message belongs to: its chat, or its forum topic; tool settings are per chat."""
    chat = message.chat
    topic = message.message_thread_id if message.is_topic_message else None
    session_id = f"tg:{chat.id}" if topic is None else f"tg:{chat.id}:{topic}"
    return Session(session_id, f"tg:{chat.id}", chat.type, chat.title or chat.full_name or "", chat.id)


def user_language(update: Update) -> str:
    """'zh' or 'en', from the sender's Telegram language."""
    user = update.effective_user
    return language(user.language_code if user else None)


def topic_of(message: Message) -> int | None:
    """The forum topic to answer in, if the message is in one."""
    return message.message_thread_id if message.is_topic_message else None


async def reply(message: Message, body: str) -> None:
    """Answer `message` in its chat (and topic), replying to it, split and formatted safely."""
    await send_text(message.get_bot(), message.chat_id, body, reply_to=message.message_id,
                    thread_id=topic_of(message))


async def allowed(update: Update, context: BotContext) -> bool:
    """Whether the sender may use the bot here; tells them their id and how to get access when not."""
    user, message = update.effective_user, update.effective_message
    if await context.access.may_talk(user.id if user else None, message.chat_id, message.chat.type):
        return True
    if user is not None:
        await reply(message, text("not_allowed", user_language(update), user_id=user.id))
    return False


def is_blank(question: str) -> bool:
    """Whether a question shows nothing: only spaces and invisible marks (zero-width, text direction)."""
    return all(char.isspace() or unicodedata.category(char) in ("Cf", "Cc", "Zs") for char in question)


def asker_name(user: User) -> str:
    """How a group question is attributed to its asker, for the model."""
    return user.full_name or (f"@{user.username}" if user.username else str(user.id))


# --- questions -------------------------------------------------------------------------------------------------

async def on_text(update: Update, context: BotContext) -> None:
    """A text message: a question in a private chat; in a group only when it mentions or replies to the bot."""
    message = update.effective_message
    question = addressed_question(message, context.bot.username, context.bot.id)
    if question is None:
        return  # group chatter: not for us, never stored
    await answer_question(update, context, question)


async def ask(update: Update, context: BotContext) -> None:
    """/ask QUESTION: a question, in groups as in private chats."""
    parts = (update.effective_message.text or "").split(maxsplit=1)
    await answer_question(update, context, parts[1].strip() if len(parts) > 1 else "")


async def answer_question(update: Update, context: BotContext, question: str) -> None:
    """Take the question's place in line, check access, wait for its turn, run it and reply."""
    message, user = update.effective_message, update.effective_user
    lang = user_language(update)
    if user is None:
        return
    if is_blank(question):
        await reply(message, text("ask_usage", lang))
        return
    session = session_for(message)
    # The place in line is taken before the first await, so turns keep the order the updates came in.
    slot = context.turns.reserve(session.id, user.id, update.update_id)
    try:
        if not await allowed(update, context):
            return
        if slot.behind_own_turn:
            await quietly(reply(message, text("queued", lang)), "the queued notice")
        if await context.turns.wait_turn(slot):
            prompt = f"{asker_name(user)}: {question}" if is_group(message) else question
            await run_turn(context, message, session, prompt, slot, lang)
    finally:
        context.turns.release(slot)


async def run_turn(context: BotContext, message: Message, session: Session, question: str, slot: TurnSlot,
                   lang: str) -> None:
    """Run the agent with typing and progress feedback; send the answer (or a short apology)."""
    settings = context.settings
    feedback = TurnFeedback(context.bot, message.chat_id, placeholder=text("thinking", lang),
                            reply_to=message.message_id, thread_id=topic_of(message),
                            typing_every=settings.typing_interval_seconds,
                            progress_after=settings.progress_after_seconds)
    try:
        async with feedback:
            answer = await agent_answer(context, session, question, slot, lang, feedback)
        if answer is not None:
            await deliver(context, message, answer, slot)
    finally:
        await feedback.remove()  # the answer (or the apology of the error handler) replaces it


async def deliver(context: BotContext, message: Message, answer: str, slot: TurnSlot) -> None:
    """Send the answer; if Telegram stays unreachable past the send's patience, leave the update for a restart."""
    try:
        await reply(message, answer)
    except (NetworkError, RetryAfter):
        # The turn is stored already: left unhandled in the journal, its update is answered from the store after
        # the next start (bot/delivery.py) instead of being lost. The error handler still logs the failure.
        if slot.update_id is not None:
            context.turns.interrupted.add(slot.update_id)
        raise
    slot.answered = True


async def agent_answer(context: BotContext, session: Session, question: str, slot: TurnSlot, lang: str,
                       feedback: TurnFeedback) -> str | None:
    """The agent's answer, an apology when the model failed, or None when the turn was cancelled."""
    source_key = f"tg:update:{slot.update_id}" if slot.update_id is not None else None
    if source_key and (stored := await context.services.memory.stored_answer(source_key)) is not None:
        return stored  # a redelivered update (restart): answer it again, do not store it twice
    try:
        result = await context.services.agent.run(session, question, user_id=slot.user_id, source_key=source_key,
                                                  on_progress=feedback.show, cancel=slot.cancel)
    except LLMTimeout:
        return text("timeout", lang)
    except LLMCancelled:
        # /cancel already said "stopped"; a turn stopped by shutdown stays unhandled in the update journal and is
        # answered after the restart (bot/delivery.py).
        return None if slot.cancelled_by in (BY_USER, BY_SHUTDOWN) else text("timeout", lang)
    except LLMError as error:
        log.warning("model failed in %s: %s", session.id, error)
        return text("model_error", lang)
    except sqlite3.OperationalError as error:
        if not database_busy(error):
            raise
        # Another process held the write lock past DATABASE_BUSY_TIMEOUT_SECONDS: nothing of the turn was stored.
        log.warning("database busy in %s: %s", session.id, error)
        return text("busy", lang)
    return result.answer


def database_busy(error: sqlite3.OperationalError) -> bool:
    """Whether SQLite gave up waiting for another connection's lock (the busy timeout ran out)."""
    return (getattr(error, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


async def non_text(update: Update, context: BotContext) -> None:
    """Stickers, photos, voice, files in a private chat: say that only text is read."""
    await reply(update.effective_message, text("text_only", user_language(update)))


# --- user commands ---------------------------------------------------------------------------------------------

async def start(update: Update, context: BotContext) -> None:
    """/start: what the bot does, in the user's language (and how to get access, for strangers)."""
    lang = user_language(update)
    message, user = update.effective_message, update.effective_user
    body = text("start", lang)
    if user and not await context.access.may_talk(user.id, message.chat_id, message.chat.type):
        body += "\n\n" + text("not_allowed", lang, user_id=user.id)
    await reply(message, body)


async def help_command(update: Update, context: BotContext) -> None:
    """/help: how to ask, and the commands."""
    await reply(update.effective_message, text("help", user_language(update)))


async def reset(update: Update, context: BotContext) -> None:
    """/reset: forget this chat's (or topic's) history."""
    if not await allowed(update, context):
        return
    await context.services.memory.reset(session_for(update.effective_message).id)
    await reply(update.effective_message, text("reset", user_language(update)))


async def cancel(update: Update, context: BotContext) -> None:
    """/cancel: stop the sender's running and waiting questions here (an admin's: everyone's)."""
    if not await allowed(update, context):
        return
    user, message = update.effective_user, update.effective_message
    whose = None if context.access.is_admin(user.id) else user.id
    stopped = context.turns.cancel(session_for(message).id, whose)
    await reply(message, text("cancelled" if stopped else "nothing_to_cancel", user_language(update)))


async def trace(update: Update, context: BotContext) -> None:
    """/trace: the steps of this chat's last turn: tool, input, observation, time."""
    if not await allowed(update, context):
        return
    lang = user_language(update)
    turn = await context.services.memory.last_turn(session_for(update.effective_message).id)
    await reply(update.effective_message, trace_text(turn, lang) if turn else text("no_trace", lang))


def trace_text(turn: StoredTurn, lang: str) -> str:
    """A stored turn for /trace: each step's tool, input, observation and time; long texts shortened."""
    lines = [text("trace_header", lang, status=turn.status, seconds=turn.duration_ms / 1000), f"❓ {turn.question}"]
    for step in turn.steps:
        if step.kind in ("tool", "repeated"):
            lines.append(f"{step.position}. 🔧 {step.action} {step.action_input.strip()} ({step.duration_ms} ms)")
            lines.append(f"   → {shorten(step.observation)}")
        elif step.kind != "final":
            lines.append(f"{step.position}. ⚠️ {step.kind}: {shorten(step.observation or step.error or '')}")
    if not any(step.kind in ("tool", "repeated") for step in turn.steps):
        lines.append(text("trace_no_steps", lang))
    lines.append(f"💬 {shorten(turn.answer)}")
    return "\n".join(lines)


def shorten(value: str, limit: int = TRACE_TEXT_CHARS) -> str:
    """One line of at most `limit` characters."""
    flat = " ".join(value.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


async def tools(update: Update, context: BotContext) -> None:
    """/tools: the tools enabled in this chat (/tools all, for admins, is in bot/admin.py)."""
    if not await allowed(update, context):
        return
    lang = user_language(update)
    chat_key = session_for(update.effective_message).chat_key
    enabled = await context.services.tool_settings.enabled_tools(chat_key)
    lines = [f"• {tool.name} — {tool.human_name}" for tool in enabled]
    body = "\n".join([text("tools_header", lang), *lines]) if lines else text("no_tools", lang)
    await reply(update.effective_message, body)


async def unknown_command(update: Update, context: BotContext) -> None:
    """A command the bot does not know, in a private chat: show /help."""
    await help_command(update, context)


# --- errors ----------------------------------------------------------------------------------------------------

async def on_error(update: object, context: BotContext) -> None:
    """Log a handler's failure and give the user a short apology (the token never reaches a log: bot/logs.py)."""
    if isinstance(context.error, Forbidden):
        log.info("update %s: the user blocked the bot or left the chat", getattr(update, "update_id", "?"))
        return
    log.error("handling update %s failed", getattr(update, "update_id", "?"), exc_info=context.error)
    if not isinstance(update, Update) or update.effective_message is None:
        return
    message = update.effective_message
    if is_group(message) and addressed_question(message, context.bot.username, context.bot.id) is None \
            and not (message.text or "").startswith("/"):
        return  # a failure on group chatter is not worth a message to the group
    await quietly(reply(message, text("apology", user_language(update))), "the apology")
