"""A message from the bot's side: which session it belongs to, its sender's language, who may talk there, and how
to answer it. Shared by the user handlers, the admin commands and the question path."""

from __future__ import annotations

import logging

from telegram import Message, ReplyParameters, Update
from telegram.error import TelegramError

from agent.memory import Session
from bot.telegram.access import GROUP_TYPES
from bot.telegram.context import BotContext
from bot.telegram.i18n import language, text
from bot.telegram.ratelimit import SPARE_ONLY, NoSpareCapacity
from bot.telegram.replies import send_text

log = logging.getLogger(__name__)


def session_for(message: Message) -> Session:
    """The history a message belongs to: its chat, or its forum topic; tool settings are per chat."""
    chat = message.chat
    topic = topic_of(message)
    key = chat_key(chat.id)
    session_id = key if topic is None else f"{key}:{topic}"
    return Session(session_id, key, chat.type, chat.title or chat.full_name or "", chat.id)


def chat_key(chat_id: int) -> str:
    """A Telegram chat's key: its history's session id (a topic adds `:<topic>`) and its tool settings' scope."""
    return f"tg:{chat_id}"


def topic_of(message: Message) -> int | None:
    """The forum topic to answer in, if the message is in one."""
    return message.message_thread_id if message.is_topic_message else None


def is_group(message: Message) -> bool:
    """Whether the message comes from a group or supergroup."""
    return message.chat.type in GROUP_TYPES


def user_language(update: Update) -> str:
    """'zh' or 'en', from the sender's Telegram language."""
    user = update.effective_user
    return language(user.language_code if user else None)


async def reply(message: Message, body: str) -> None:
    """Answer `message` in its chat (and topic), replying to it, split and formatted safely."""
    await send_text(message.get_bot(), message.chat_id, body, reply_to=message.message_id,
                    thread_id=topic_of(message))


async def may_talk(update: Update, context: BotContext) -> bool:
    """Whether the sender may use the bot in this chat (asked anew each time: /deny takes effect at once)."""
    user, message = update.effective_user, update.effective_message
    if not await context.access.may_talk(user.id if user else None, message.chat_id, message.chat.type):
        return False
    context.refusals.forget(user.id)  # should access be taken away again, that is worth one more refusal
    return True


async def allowed(update: Update, context: BotContext) -> bool:
    """Whether the sender may use the bot here; a sender who may not is refused (see `refuse`)."""
    if await may_talk(update, context):
        return True
    await refuse(update, context)
    return False


async def refuse(update: Update, context: BotContext, lead: str = "") -> None:
    """Tell a sender without access their id and how to get access, after `lead` (e.g. the /start text).

    Once per REFUSAL_INTERVAL_SECONDS per sender, and only with spare sending capacity (bot/telegram/ratelimit.py): a
    stranger's flood costs one message, and never delays an answer. A message with no sender (a channel writing
    in a group) has no id to give: it gets `lead` alone, if anything, under the same rule for its channel.
    """
    user, message = update.effective_user, update.effective_message
    parts = [lead, text("not_allowed", user_language(update), user_id=user.id) if user else ""]
    body = "\n\n".join(part for part in parts if part)
    sender = user.id if user else (message.sender_chat or message.chat).id
    if not body or not context.refusals.may_tell(sender):
        return
    try:
        await message.get_bot().send_message(
            message.chat_id, body, message_thread_id=topic_of(message), rate_limit_args=SPARE_ONLY,
            reply_parameters=ReplyParameters(message.message_id, allow_sending_without_reply=True))
    except NoSpareCapacity:
        context.refusals.forget(sender)  # not told after all: their next message may be
        log.info("no spare capacity to refuse sender %s in chat %s; skipped", sender, message.chat_id)
    except TelegramError as error:
        log.info("refusing sender %s failed: %s", sender, error)


async def reply_or_refuse(update: Update, context: BotContext, body: str) -> None:
    """Reply `body` to a sender with access; to one without, `body` goes with the refusal, once per interval."""
    if await may_talk(update, context):
        await reply(update.effective_message, body)
    else:
        await refuse(update, context, lead=body)
