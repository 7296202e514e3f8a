"""Questions asked by voice, and questions about a picture: from a Telegram message to a question for the agent.

A recording (a voice note, an audio file, a video note) is fetched from Telegram (`getFile`, then the file),
transcribed (agent/speech/), shown to its sender (`🎤 …`: in a private chat at the start of the answer, in a group
as a reply to the recording) and asked as if it had been typed. A picture (a photo, or an image sent as a file)
goes with the question in its caption, or with a question written in reply to it, to a model that can see; to one
that cannot, the sender is told so in one line and nothing is fetched.

Both are `Attachment`s of the question path (bot/telegram/questions.py): a recording or a picture is fetched and
made into the question at the question's place in line, after the access check, so access, turn order,
MAX_PENDING_QUESTIONS and everything else a typed question meets apply to it alike, and a stranger's voice note
costs nothing. Every failure (too long, too large, unreadable, the speech backend down) is one line to the sender.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from telegram import Message, Update
from telegram.constants import ChatAction
from telegram.error import TelegramError

from agent.errors import AudioTooLong, NotAnImage, NotAudio, SpeechTimeout, SpeechUnavailable
from agent.images import fit_picture
from bot.telegram.chat import is_group, reply, reply_or_refuse, topic_of, user_language
from bot.telegram.context import BotContext
from bot.telegram.i18n import text
from bot.telegram.questions import Asked, addressed_question, answer_question
from bot.telegram.replies import quietly

log = logging.getLogger(__name__)

MB = 1024 * 1024


# --- handlers' work ----------------------------------------------------------------------------------------------

async def answer_recording(update: Update, context: BotContext) -> None:
    """A voice note, audio file or video note meant for the bot: transcribed, then answered as a question."""
    message = update.effective_message
    caption = addressed_question(message, context.bot.username, context.bot.id, caption=True)
    if caption is None:
        return  # group chatter: not for us, never fetched
    if context.services.speech is None:  # ASR_BACKEND=off: the polite refusal of any other non-text message
        if not is_group(message):
            await reply_or_refuse(update, context, text("text_only", user_language(update)))
        return
    await answer_question(update, context, caption, Recording.of(message))


async def answer_picture(update: Update, context: BotContext) -> None:
    """A photo or image file meant for the bot: its caption is the question; without one, the sender is told how
    to ask about it (or, where the model cannot see, that it reads text only)."""
    message = update.effective_message
    question = addressed_question(message, context.bot.username, context.bot.id, caption=True)
    if question is None:
        return  # group chatter
    if not question:
        if message.media_group_id:
            return  # one picture of an album: the album's caption, if any, is on another of them
        hint = "picture_needs_question" if context.services.llm.sees_images else "text_only_model"
        await reply_or_refuse(update, context, text(hint, user_language(update)))
        return
    await answer_question(update, context, question, PictureFile.of(message))


def picture_replied_to(message: Message) -> "PictureFile | None":
    """The picture a text question replies to, which goes with the question; None when it replies to no picture."""
    replied = message.reply_to_message
    return PictureFile.of(replied) if replied is not None and has_picture(replied) else None


def has_picture(message: Message) -> bool:
    """Whether the message is a photo, or an image sent as a file."""
    document = message.document
    return bool(message.photo) or (document is not None and (document.mime_type or "").startswith("image/"))


# --- recordings --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recording:
    """A recording in a message, as Telegram describes it (its declared duration and size)."""

    message: Message
    file_id: str
    duration: int
    file_size: int | None

    @classmethod
    def of(cls, message: Message) -> "Recording":
        """The voice note, audio file or video note of `message`."""
        media = message.voice or message.audio or message.video_note
        return cls(message, media.file_id, int(media.duration or 0), media.file_size)

    async def prepare(self, update: Update, context: BotContext, caption: str) -> Asked | None:
        """Fetch and transcribe the recording; show the transcript in a group (a private chat shows it as the
        answer's lead); the question is the transcript, after the caption's words if there are any."""
        lang, voice = user_language(update), context.settings.voice
        if self.duration > voice.asr_max_seconds:
            return await _tell(self.message, text("voice_too_long", lang, limit=f"{voice.asr_max_seconds:g}"))
        if self.file_size and self.file_size > voice.asr_max_file_mb * MB:
            return await _tell(self.message, text("voice_too_big", lang, size=self.file_size / MB,
                                                  limit=voice.asr_max_file_mb))
        data = await fetch_file(context, self.message, self.file_id, voice.asr_max_file_mb, lang, "voice_too_big")
        if data is None:
            return None
        heard = await self._transcript(context, data, lang)
        if heard is None:
            return None
        shown = text("transcript", lang, text=heard)
        if is_group(self.message):
            await quietly(reply(self.message, shown), "showing the transcript")
        question = f"{caption}\n{heard}" if caption else heard
        return Asked(question, input_kind="voice", lead="" if is_group(self.message) else shown)

    async def _transcript(self, context: BotContext, data: bytes, lang: str) -> str | None:
        """What was said; None when the sender was told why there is nothing (one line each)."""
        limit = f"{context.settings.voice.asr_max_seconds:g}"
        try:
            transcript = await context.services.speech.transcribe(data)
        except AudioTooLong:
            return await _tell(self.message, text("voice_too_long", lang, limit=limit))
        except NotAudio as error:
            log.info("update message %s: not a readable recording: %s", self.message.message_id, error)
            return await _tell(self.message, text("not_audio", lang))
        except SpeechTimeout as error:
            log.warning("transcribing message %s: %s", self.message.message_id, error)
            return await _tell(self.message, text("voice_timeout", lang))
        except SpeechUnavailable as error:
            log.warning("transcribing message %s: %s", self.message.message_id, error)
            return await _tell(self.message, text("voice_failed", lang))
        log.info("transcribed %.1f s of %s speech in chat %s", transcript.audio_seconds, transcript.language or "?",
                 self.message.chat_id)
        if not transcript.text.strip():
            return await _tell(self.message, text("voice_unheard", lang))
        return transcript.text.strip()


# --- pictures ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PictureFile:
    """A picture in a message: the photo size to fetch (the smallest one at least as large as the model takes, so
    less is downloaded), or the image file."""

    message: Message
    file_id: str
    file_size: int | None

    @classmethod
    def of(cls, message: Message, max_side: int = 0) -> "PictureFile":
        """The picture of `message` (see `has_picture`)."""
        if not message.photo:
            return cls(message, message.document.file_id, message.document.file_size)
        sizes = sorted(message.photo, key=lambda size: size.width * size.height)
        large_enough = [size for size in sizes if max(size.width, size.height) >= max_side]
        chosen = large_enough[0] if max_side and large_enough else sizes[-1]
        return cls(message, chosen.file_id, chosen.file_size)

    async def prepare(self, update: Update, context: BotContext, question: str) -> Asked | None:
        """Fetch the picture and shrink it to IMAGE_MAX_SIDE, for a model that sees; else tell the sender."""
        lang, images = user_language(update), context.settings.images
        asking = update.effective_message  # the photo itself, or the question written in reply to it
        if not context.services.llm.sees_images:
            return await _tell(asking, text("text_only_model", lang))
        file = PictureFile.of(self.message, images.image_max_side)  # the smallest photo size that is enough
        if file.file_size and file.file_size > images.image_max_file_mb * MB:
            return await _tell(asking, text("picture_too_big", lang, size=file.file_size / MB,
                                            limit=images.image_max_file_mb))
        data = await fetch_file(context, asking, file.file_id, images.image_max_file_mb, lang, "picture_too_big")
        if data is None:
            return None
        try:
            picture = await asyncio.to_thread(fit_picture, data, images.image_max_side)  # decoding is CPU work
        except NotAnImage as error:
            log.info("message %s: %s", self.message.message_id, error)
            return await _tell(asking, text("not_a_picture", lang))
        return Asked(question, (picture,), "photo")


async def _tell(message: Message, line: str) -> None:
    """Answer `message` with one line (why there is no question to ask); returns None, the attachment's "none"."""
    await reply(message, line)


# --- fetching ----------------------------------------------------------------------------------------------------

async def fetch_file(context: BotContext, message: Message, file_id: str, limit_mb: float, lang: str,
                     too_big: str) -> bytes | None:
    """The file's bytes from the Bot API (`getFile`, then the file), with "typing" shown meanwhile; None when the
    sender was told it could not be fetched, or is larger than `limit_mb` (told with the text `too_big`)."""
    await quietly(context.bot.send_chat_action(message.chat_id, ChatAction.TYPING,
                                               message_thread_id=topic_of(message)), "typing")
    timeout = context.settings.telegram.telegram_download_timeout_seconds
    try:
        file = await context.bot.get_file(file_id, read_timeout=timeout)
        data = bytes(await file.download_as_bytearray(read_timeout=timeout))
    except TelegramError as error:
        log.info("fetching file %s of message %s failed: %s", file_id, message.message_id, error)
        await reply(message, text("download_failed", lang))
        return None
    if len(data) > limit_mb * MB:  # Telegram did not declare the size: it is checked once the file is here
        await reply(message, text(too_big, lang, size=len(data) / MB, limit=limit_mb))
        return None
    return data
