"""User handlers, thin as in python-telegram-bot's examples: read the update, call one function, reply.

Questions go to questions.py (asked by voice or about a picture: through media.py); admin commands live in
admin.py; both reply through chat.py (all in bot/telegram/).
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

from telegram import InputFile, ReplyParameters, Update
from telegram.error import Forbidden

from bot.program.doc_reports import documents_text
from bot.program.export import render_export
from bot.telegram.chat import (allowed, is_group, may_talk, refuse, reply, reply_or_refuse, session_for, topic_of,
                               user_language)
from bot.telegram.context import BotContext
from bot.telegram.i18n import text
from bot.telegram.media import answer_picture, answer_recording, picture_replied_to
from bot.telegram.questions import addressed_question, answer_question, duration_text
from bot.telegram.quotas import QuotaState
from bot.telegram.replies import quietly, tools_text, trace_text
from bot.telegram.supergroups import carry_over
from db import DatabaseGone

log = logging.getLogger(__name__)

CAPTION_MAX_CHARS = 1024  # Telegram's limit for a document's caption


# --- questions -------------------------------------------------------------------------------------------------

async def on_text(update: Update, context: BotContext) -> None:
    """A text message: a question in a private chat; in a group only when it mentions or replies to the bot. A
    question written in reply to a picture is about that picture."""
    message = update.effective_message
    question = addressed_question(message, context.bot.username, context.bot.id)
    if question is not None:  # else group chatter: not for us, never stored
        await answer_question(update, context, question, picture_replied_to(message))


async def on_recording(update: Update, context: BotContext) -> None:
    """A voice note, audio file or video note: transcribed and answered as a question (where it is one)."""
    await answer_recording(update, context)


async def on_picture(update: Update, context: BotContext) -> None:
    """A photo or image file: its caption is a question about it (where it is one)."""
    await answer_picture(update, context)


async def ask(update: Update, context: BotContext) -> None:
    """/ask QUESTION: a question, in groups as in private chats."""
    parts = (update.effective_message.text or "").split(maxsplit=1)
    await answer_question(update, context, parts[1].strip() if len(parts) > 1 else "")


async def non_text(update: Update, context: BotContext) -> None:
    """Stickers, files, locations… in a private chat: say that only text is read (voice and pictures have their
    own handlers)."""
    await reply_or_refuse(update, context, text("text_only", user_language(update)))


# --- user commands ---------------------------------------------------------------------------------------------

async def start(update: Update, context: BotContext) -> None:
    """/start: what the bot does, in the user's language (and how to get access, for strangers)."""
    await reply_or_refuse(update, context, text("start", user_language(update)))


async def help_command(update: Update, context: BotContext) -> None:
    """/help: how to ask, the commands, and this chat's persona (for a sender without access, with how to get
    access instead: see `refuse`)."""
    lang, message = user_language(update), update.effective_message
    body = text("help", lang)
    if not await may_talk(update, context):
        return await refuse(update, context, lead=body)
    persona = await context.services.options.persona(session_for(message).chat_key,
                                                     context.settings.conversations.default_persona)
    if persona:
        body += "\n\n" + text("help_persona", lang, persona=persona)
    await reply(message, body)


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
    listing = documents_text(await context.services.documents.documents(here), here, user_language(update))
    await reply(update.effective_message, listing)


async def memory(update: Update, context: BotContext) -> None:
    """/memory: the summary this chat's older turns were folded into, if any."""
    if not await allowed(update, context):
        return
    lang, session_id = user_language(update), session_for(update.effective_message).id
    summary = await context.services.memory.summary(session_id)
    if summary is None:
        return await reply(update.effective_message, text("memory_none", lang))
    recent = await context.services.memory.turns_after(session_id, summary.through_turn_id)
    await reply(update.effective_message, text("memory_summary", lang, count=summary.folded_turns,
                                               updated=summary.updated_at[:16].replace("T", " "),
                                               summary=summary.text, recent=len(recent)))


async def quota(update: Update, context: BotContext) -> None:
    """/quota: the sender's share left today, and when it resets."""
    if not await allowed(update, context):
        return
    lang, user = user_language(update), update.effective_user
    quotas = context.quotas
    window = quotas.window()
    lines = [text("quota_header", lang, reset=window.reset.strftime("%H:%M"),
                  wait=duration_text(window.until_reset(quotas.clock()), lang))]
    lines += [quota_line(state, lang) for state in await quotas.states(user.id)]
    if context.access.is_admin(user.id):
        lines.append(text("quota_admin", lang))
    await reply(update.effective_message, "\n".join(lines))


def quota_line(state: QuotaState, lang: str) -> str:
    """One limit for /quota: what was used, and of how much."""
    if state.unlimited:
        return text(f"quota_{state.kind}_unlimited", lang, used=state.used)
    return text(f"quota_{state.kind}", lang, used=state.used, limit=state.limit, left=state.left)


async def export(update: Update, context: BotContext) -> None:
    """/export: this chat's history as a Markdown document (with each turn's steps, for admins)."""
    if not await allowed(update, context):
        return
    message, lang = update.effective_message, user_language(update)
    session = session_for(message)
    with_steps = context.access.is_admin(update.effective_user.id)
    turns = await context.services.memory.exported_turns(session.id, with_steps=with_steps)
    if not turns:
        return await reply(message, text("export_nothing", lang))
    document = render_export(session.title or session.id, turns, await context.services.memory.summary(session.id),
                             lang=lang, with_steps=with_steps,
                             max_bytes=context.settings.conversations.export_max_bytes)
    caption = (text("export_caption_cut", lang, turns=document.turns, left_out=document.left_out)
               if document.left_out else text("export_caption", lang, turns=document.turns))
    await message.get_bot().send_document(
        message.chat_id, InputFile(document.data, filename=export_file_name(message.chat_id)),
        caption=caption[:CAPTION_MAX_CHARS], message_thread_id=topic_of(message),
        reply_parameters=ReplyParameters(message.message_id, allow_sending_without_reply=True))


def export_file_name(chat_id: int) -> str:
    """The document's name: the chat and the day."""
    return f"chat-{chat_id}-{datetime.now(timezone.utc):%Y%m%d}.md"


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
