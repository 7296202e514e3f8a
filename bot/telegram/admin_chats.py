"""Admin commands about chats and their users: /persona (a chat's persona) and /quota_set (a user's daily limits).
Refused for everyone else; every change audited; replies in the admin's language.

A persona is an instruction added to the system prompt of the chat it is set in (agent/prompts.py): it may change
the tone and the role, never the ReAct format or the tool rules, which follow it unchanged.
"""

from __future__ import annotations

from telegram import Update

from agent.options import PERSONA
from bot.program.ids import IdError, parse_user_id
from bot.program.texts import text
from bot.telegram.admin import admin_only, arguments, error_and_usage, record, usage
from bot.telegram.chat import reply, session_for, user_language
from bot.telegram.context import BotContext
from bot.telegram.quotas import KINDS

RESET = "reset"
DEFAULT = "default"


async def persona(update: Update, context: BotContext) -> None:
    """/persona TEXT | reset: set or clear this chat's persona; /persona alone shows it."""
    if not await admin_only(update, context):
        return
    message, lang = update.effective_message, user_language(update)
    parts = (message.text or "").split(maxsplit=1)
    wanted = parts[1].strip() if len(parts) > 1 else ""
    chat_key = session_for(message).chat_key
    if not wanted:
        return await show_persona(update, context, chat_key)
    if wanted.lower() == RESET:
        return await reset_persona(update, context, chat_key)
    limit = context.settings.conversations.persona_max_chars
    if len(wanted) > limit:
        return await reply(message, text("persona_too_long", lang, length=len(wanted), limit=limit))
    await context.services.options.set_text(PERSONA, wanted, chat_key)
    await record(update, context, "persona", f"scope={chat_key} {wanted}")
    await reply(message, text("persona_set", lang, persona=wanted))


async def reset_persona(update: Update, context: BotContext, chat_key: str) -> None:
    """Clear the chat's own persona: it goes back to the global one, or DEFAULT_PERSONA."""
    lang = user_language(update)
    await context.services.options.set_text(PERSONA, None, chat_key)
    await record(update, context, "persona", f"scope={chat_key} reset")
    fallback = await context.services.options.persona(chat_key, context.settings.conversations.default_persona)
    default = text("persona_default_is", lang, persona=fallback) if fallback else ""
    await reply(update.effective_message, text("persona_reset", lang, default=default))


async def show_persona(update: Update, context: BotContext, chat_key: str) -> None:
    """The chat's persona and where it comes from, then the usage line."""
    lang, options = user_language(update), context.services.options
    current = await options.persona(chat_key, context.settings.conversations.default_persona)
    source = await options.source(chat_key, PERSONA)  # chat, global or default
    shown = text("persona_current", lang, source=source, persona=current) if current else text("persona_none", lang)
    await reply(update.effective_message, shown + "\n\n" + text("usage", lang, usage=text("usage_persona", lang)))


async def quota_set(update: Update, context: BotContext) -> None:
    """/quota_set USER turns|tokens N|default: a user's own daily limit (0 = unlimited), or back to the setting."""
    if not await admin_only(update, context):
        return
    args, lang = arguments(update), user_language(update)
    if len(args) != 3 or args[1].lower() not in KINDS or not (args[2].lower() == DEFAULT or _count(args[2])):
        return await usage(update, "quota_set")
    try:
        user_id = parse_user_id(args[0])
    except IdError as error:
        return await error_and_usage(update, "quota_set", error)
    kind, limit = args[1].lower(), None if args[2].lower() == DEFAULT else int(args[2])
    await context.quotas.set_limit(user_id, kind, limit, by=update.effective_user.id)
    await record(update, context, "quota_set", f"user {user_id} {kind}={args[2].lower()}")
    state = next(s for s in await context.quotas.states(user_id) if s.kind == kind)
    shown = text("unlimited", lang) if state.unlimited else state.limit
    key = "quota_set_default" if limit is None else "quota_set_done"
    await reply(update.effective_message, text(key, lang, user=user_id, kind=text(f"quota_kind_{kind}", lang),
                                               limit=shown))


def _count(word: str) -> bool:
    """A limit as written: ASCII digits only, not absurdly long."""
    return word.isascii() and word.isdigit() and len(word) <= 12
