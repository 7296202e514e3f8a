"""The team's documents from Telegram: an admin adds a file, lists, deletes and scopes documents.

    a file sent to the bot in a private chat          an admin's is added, searchable in that chat
    a file with the caption /doc_add [global]         the same, in a group (or private): here, or every chat
    /doc_add [global] in reply to a message with a file
    /docs all                                         every document, wherever it may be searched (plain /docs,
                                                      the documents this chat can search, is a user command)
    /doc_del ID, /doc_scope ID global|here            admins

Each file gets one reply line: added, replaced (a new version of the same name), unchanged (the same file), or
why it was refused (type, size, Telegram's 20 MB download limit for bots, no text, a zip bomb, the budget). The
type and the size are checked before the file is downloaded; the library does the rest, all or nothing
(tools/docs_store.py), and audits every change.
"""

from __future__ import annotations

import logging
import re

from telegram import Document, Update
from telegram.error import TelegramError

from bot.program.doc_reports import adding_text, chunks, documents_text, where
from bot.telegram.admin import admin_only, arguments, usage
from bot.telegram.chat import reply, reply_or_refuse, session_for, user_language
from bot.telegram.context import BotContext
from bot.telegram.i18n import text
from tools.docs_convert import MB, check_type, megabytes
from tools.docs_store import Upload
from tools.errors import DocumentError
from tools.settings import GLOBAL

log = logging.getLogger(__name__)

TELEGRAM_DOWNLOAD_LIMIT = 20 * MB  # getFile refuses bigger files to bots ("file is too big")
CAPTION_COMMAND = re.compile(r"^/doc_add(@\w+)?(\s|$)", re.IGNORECASE)  # a file's caption that adds it


# --- adding ----------------------------------------------------------------------------------------------------

async def on_private_file(update: Update, context: BotContext) -> None:
    """A file in a private chat: an admin's is added (searchable in that chat, or everywhere with the caption
    `global`); anyone else is told that only admins add documents."""
    message = update.effective_message
    if not await admins_only(update, context):
        return
    words = (message.caption or "").split()
    scope_word = words[-1].lower() if words and words[-1].lower() == GLOBAL else ""
    await add_file(update, context, message.document, scope_word)


async def doc_add_caption(update: Update, context: BotContext) -> None:
    """A file with /doc_add [global] as its caption (in a group, the way to hand the bot a file); /doc_add@other_bot
    is for another bot."""
    message = update.effective_message
    named = CAPTION_COMMAND.match(message.caption or "").group(1)
    if named and named[1:].lower() != (context.bot.username or "").lower():
        return
    if not await admins_only(update, context):
        return
    words = (message.caption or "").split()[1:]
    if len(words) > 1 or (words and words[0].lower() != GLOBAL):
        return await usage(update, "doc_add")
    await add_file(update, context, message.document, words[0].lower() if words else "")


async def doc_add(update: Update, context: BotContext) -> None:
    """/doc_add [global] in reply to a message with a file."""
    if not await admin_only(update, context):
        return
    args = [word.lower() for word in arguments(update)]
    replied = update.effective_message.reply_to_message
    if replied is None or replied.document is None or len(args) > 1 or (args and args[0] != GLOBAL):
        return await usage(update, "doc_add")
    await add_file(update, context, replied.document, args[0] if args else "")


async def admins_only(update: Update, context: BotContext) -> bool:
    """Whether the sender is an admin; anyone else gets the one line saying who adds documents."""
    user = update.effective_user
    if user is not None and context.access.is_admin(user.id):
        return True
    await reply_or_refuse(update, context, text("docs_admins_only", user_language(update)))
    return False


async def add_file(update: Update, context: BotContext, document: Document, scope_word: str) -> None:
    """Check, download and add `document`; reply with what happened, in one line."""
    message, user = update.effective_message, update.effective_user
    here = session_for(message).chat_key
    name = document.file_name or "document"
    library = context.services.documents
    try:
        check_type(name)
        library.check_size(name, document.file_size or 0)
        data = await download(context, document, name)
        upload = Upload(name, data, scope=GLOBAL if scope_word == GLOBAL else here, added_by=user.id,
                        added_by_name=user.full_name or str(user.id), added_in=message.chat_id)
        added = await library.add(upload)
    except DocumentError as error:
        return await reply(message, f"❌ {error}")
    await reply(message, adding_text(added, here, user_language(update)))


async def download(context: BotContext, document: Document, name: str) -> bytes:
    """The file's bytes from the Bot API (getFile, then its file path); Telegram's own 20 MB limit for bots, and
    a failed download, as `DocumentError`s."""
    if (document.file_size or 0) > TELEGRAM_DOWNLOAD_LIMIT:
        raise DocumentError(too_big_for_bots(name, document.file_size or 0))
    try:
        file = await context.bot.get_file(document.file_id)
        data = bytes(await file.download_as_bytearray())
    except TelegramError as error:
        if "too big" in str(error).lower():
            raise DocumentError(too_big_for_bots(name, document.file_size or 0)) from None
        log.warning("downloading %s failed: %s", name, error)
        raise DocumentError(f"{name}: the download from Telegram failed ({error}); send it again") from None
    context.services.documents.check_size(name, len(data))  # the size a message declares is optional
    return data


def too_big_for_bots(name: str, size: int) -> str:
    """Why a file over Telegram's download limit for bots cannot be added from Telegram, and what works instead."""
    shown = f" ({megabytes(size)})" if size else ""
    return (f"{name}{shown}: Telegram lets bots download files of up to {megabytes(TELEGRAM_DOWNLOAD_LIMIT)}; add "
            "it on the server with `qwenbot docs add PATH`")


# --- listing, deleting, scoping --------------------------------------------------------------------------------

async def docs_all(update: Update, context: BotContext) -> None:
    """/docs all: every document, wherever it may be searched (plain /docs is in bot/telegram/handlers.py)."""
    if not await admin_only(update, context):
        return
    here = session_for(update.effective_message).chat_key
    await reply(update.effective_message, documents_text(await context.services.documents.documents(), here,
                                                         user_language(update)))


async def doc_del(update: Update, context: BotContext) -> None:
    """/doc_del ID: remove a document, its chunks and their index entries."""
    if not await admin_only(update, context):
        return
    args = arguments(update)
    if len(args) != 1 or not _is_id(args[0]):
        return await usage(update, "doc_del")
    user, chat = update.effective_user, update.effective_chat
    try:
        removed = await context.services.documents.remove(int(args[0]), by=user.id, chat_id=chat.id)
    except DocumentError as error:
        return await reply(update.effective_message, f"❌ {error}")
    lang = user_language(update)
    await reply(update.effective_message, text("doc_removed", lang, label=removed.label(),
                                               chunks=chunks(removed.chunk_count, lang)))


async def doc_scope(update: Update, context: BotContext) -> None:
    """/doc_scope ID global|here: search a document in every chat, or in this one only."""
    if not await admin_only(update, context):
        return
    args = [word.lower() for word in arguments(update)]
    if len(args) != 2 or not _is_id(args[0]) or args[1] not in (GLOBAL, "here"):
        return await usage(update, "doc_scope")
    here = session_for(update.effective_message).chat_key
    scope = GLOBAL if args[1] == GLOBAL else here
    user, chat = update.effective_user, update.effective_chat
    try:
        document = await context.services.documents.set_scope(int(args[0]), scope, by=user.id, chat_id=chat.id)
    except DocumentError as error:
        return await reply(update.effective_message, f"❌ {error}")
    lang = user_language(update)
    await reply(update.effective_message, text("doc_scoped", lang, label=document.label(),
                                               where=where(scope, here, lang)))


def _is_id(word: str) -> bool:
    """A document id: ASCII digits (`str.isdigit` also takes ² and ١)."""
    return word.isascii() and word.isdigit() and int(word) > 0
