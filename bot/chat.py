"""A message from the bot's side: which session it belongs to, its sender's language, who may talk there, and how
to answer it. Shared by the user handlers, the admin commands and the question path."""

from __future__ import annotations

from telegram import Message, Update

from agent.memory import Session
from bot.access import GROUP_TYPES
from bot.context import BotContext
from bot.i18n import language, text
from bot.replies import send_text


def session_for(message: Message) -> Session:
    """The history a message belongs to: its chat, or its forum topic; tool settings are per chat."""
    chat = message.chat
    topic = topic_of(message)
    session_id = f"tg:{chat.id}" if topic is None else f"tg:{chat.id}:{topic}"
    return Session(session_id, f"tg:{chat.id}", chat.type, chat.title or chat.full_name or "", chat.id)


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


async def allowed(update: Update, context: BotContext) -> bool:
    """Whether the sender may use the bot here; tells them their id and how to get access when not."""
    user, message = update.effective_user, update.effective_message
    if await context.access.may_talk(user.id if user else None, message.chat_id, message.chat.type):
        return True
    if user is not None:
        await reply(message, text("not_allowed", user_language(update), user_id=user.id))
    return False
