"""User handlers, thin as in python-telegram-bot's examples: read the update, call one function, reply.

Questions go to questions.py; admin commands live in admin.py; both reply through chat.py (all in bot/telegram/).
"""

from __future__ import annotations

import logging

from telegram import Update
from telegram.error import Forbidden

from bot.program.doc_reports import documents_text
from bot.telegram.chat import allowed, is_group, reply, reply_or_refuse, session_for, user_language
from bot.telegram.context import BotContext
from bot.telegram.i18n import text
from bot.telegram.questions import addressed_question, answer_question
from bot.telegram.replies import quietly, tools_text, trace_text
from bot.telegram.supergroups import carry_over
from db import DatabaseGone

log = logging.getLogger(__name__)


# --- questions -------------------------------------------------------------------------------------------------

async def on_text(update: Update, context: BotContext) -> None:
    """A text message: a question in a private chat; in a group only when it mentions or replies to the bot."""
    question = addressed_question(update.effective_message, context.bot.username, context.bot.id)
    if question is not None:  # else group chatter: not for us, never stored
        await answer_question(update, context, question)


async def ask(update: Update, context: BotContext) -> None:
    """/ask QUESTION: a question, in groups as in private chats."""
    parts = (update.effective_message.text or "").split(maxsplit=1)
    await answer_question(update, context, parts[1].strip() if len(parts) > 1 else "")


async def non_text(update: Update, context: BotContext) -> None:
    """Stickers, photos, voice, files in a private chat: say that only text is read."""
    await reply_or_refuse(update, context, text("text_only", user_language(update)))


# --- user commands ---------------------------------------------------------------------------------------------

async def start(update: Update, context: BotContext) -> None:
    """/start: what the bot does, in the user's language (and how to get access, for strangers)."""
    await reply_or_refuse(update, context, text("start", user_language(update)))


async def help_command(update: Update, context: BotContext) -> None:
    """/help: how to ask, and the commands (for a sender without access, with how to get it: see `refuse`)."""
    await reply_or_refuse(update, context, text("help", user_language(update)))


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
    turn = await context.services.memory.last_turn(session_for(update.effective_message).id)
    await reply(update.effective_message, trace_text(turn, user_language(update)))


async def tools(update: Update, context: BotContext) -> None:
    """/tools: the tools enabled in this chat (/tools all, for admins, is in bot/telegram/admin.py)."""
    if not await allowed(update, context):
        return
    chat_key = session_for(update.effective_message).chat_key
    enabled = await context.services.tool_settings.enabled_tools(chat_key)
    await reply(update.effective_message, tools_text(enabled, user_language(update)))


async def docs(update: Update, context: BotContext) -> None:
    """/docs: the documents this chat can search (/docs all, for admins, is in bot/telegram/admin_docs.py)."""
    if not await allowed(update, context):
        return
    here = session_for(update.effective_message).chat_key
    listing = documents_text(await context.services.documents.documents(here), here)
    await reply(update.effective_message, listing)


async def unknown_command(update: Update, context: BotContext) -> None:
    """A command the bot does not know, in a private chat: show /help."""
    await help_command(update, context)


# --- service messages ------------------------------------------------------------------------------------------

async def on_migrate(update: Update, context: BotContext) -> None:
    """A group became a supergroup: carry its access, history and tool settings over to the new id."""
    message = update.effective_message
    if message.migrate_to_chat_id:  # said in the old group
        old_id, new_id = message.chat_id, message.migrate_to_chat_id
    else:  # said in the new supergroup
        old_id, new_id = message.migrate_from_chat_id, message.chat_id
    await carry_over(context.services.db, context.access, old_id, new_id)


# --- errors ----------------------------------------------------------------------------------------------------

async def on_error(update: object, context: BotContext) -> None:
    """Log a handler's failure and give the user a short apology (no token reaches a log: bot/program/logs.py)."""
    if isinstance(context.error, Forbidden):
        log.info("update %s: the user blocked the bot or left the chat", getattr(update, "update_id", "?"))
        return
    if isinstance(context.error, DatabaseGone):  # the bot is stopping for it: one line, no traceback
        log.error("update %s not handled: %s", getattr(update, "update_id", "?"), context.error)
    else:
        log.error("handling update %s failed", getattr(update, "update_id", "?"), exc_info=context.error)
    if not isinstance(update, Update) or update.effective_message is None:
        return
    message = update.effective_message
    if is_group(message) and addressed_question(message, context.bot.username, context.bot.id) is None \
            and not (message.text or "").startswith("/"):
        return  # a failure on group chatter is not worth a message to the group
    apology = "database_gone" if isinstance(context.error, DatabaseGone) else "apology"
    await quietly(reply(message, text(apology, user_language(update))), "the apology")
