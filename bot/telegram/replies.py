"""Telegram-shaped output: 4096-character splitting, safe formatting, typing and progress while a turn runs.

The rule everywhere here: an auxiliary call (typing, a progress message, an edit, a deletion) may fail and the
answer still goes out; formatting Telegram refuses is sent again as plain text. Every text sent passes
`outgoing` first: no lone surrogates, and no secret the process knows (core/secrets.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import re
from typing import Awaitable, Callable, Sequence, TypeVar

from telegram import Bot, Message, ReplyParameters
from telegram.constants import ChatAction, MessageLimit, ParseMode
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TelegramError

from agent.memory import StoredTurn
from agent.steps import TOOL_KINDS
from agent.traces import render_trace, shorten
from agent.unicode import clean_text
from core.secrets import redact
from bot.program.config import StreamingSettings, TurnsSettings
from bot.telegram.i18n import text
from bot.telegram.progress import ProgressLedger
from tools.registry import Tool

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_MESSAGE = MessageLimit.MAX_TEXT_LENGTH  # 4096, counted by Telegram in UTF-16 code units
# How long a reply keeps trying through flood waits and network failures: Telegram's 502s and dropped connections
# come in bursts of seconds. An answer uses SEND_PATIENCE_SECONDS from the settings (and is sent again from the
# store later if even that runs out: bot/telegram/intake.py); other replies use this default.
SEND_PATIENCE_SECONDS = TurnsSettings.send_patience_seconds
PROGRESS_PATIENCE_SECONDS = 2.0  # a progress message is not worth holding the turn up for
RETRY_PAUSES_SECONDS = (0.5, 1, 2, 4, 8)  # then every 8 s

_CODE_BLOCK = re.compile(r"```[\w+-]*\n?(.*?)```", re.DOTALL)
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", re.DOTALL)


# --- splitting -------------------------------------------------------------------------------------------------

def utf16_len(text: str) -> int:
    """Length as Telegram counts it: UTF-16 code units (an emoji outside the BMP counts two)."""
    return len(text.encode("utf-16-le")) // 2


def split_message(text: str, limit: int = MAX_MESSAGE) -> list[str]:
    """Cut `text` into pieces of at most `limit` units, at paragraph, then line, then word boundaries."""
    chunks: list[str] = []
    rest = text.strip()
    while utf16_len(rest) > limit:
        cut = _cut_point(rest, limit)
        chunks.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip("\n")
    if rest.strip():
        chunks.append(rest)
    return [chunk for chunk in chunks if chunk.strip()]


def _cut_point(text: str, limit: int) -> int:
    window = _fitting_prefix(text, limit)
    for boundary in ("\n\n", "\n", " "):
        position = window.rfind(boundary)
        if position > len(window) // 4:  # a boundary near the start would leave a uselessly short piece
            return position + len(boundary)
    return len(window)


def _fitting_prefix(text: str, limit: int) -> str:
    prefix = text[:limit]
    while (excess := utf16_len(prefix) - limit) > 0:
        prefix = prefix[:-max(1, excess // 2)]
    return prefix


# --- formatting ------------------------------------------------------------------------------------------------

def to_html(text: str) -> str | None:
    """Telegram HTML for the Markdown the model writes (```blocks```, `code`, **bold**); None if there is none."""
    parts: list[str] = []
    position = 0
    for block in _CODE_BLOCK.finditer(text):
        parts.append(_inline_html(text[position:block.start()]))
        parts.append(f"<pre>{html.escape(block.group(1), quote=False)}</pre>")
        position = block.end()
    parts.append(_inline_html(text[position:]))
    markup = "".join(parts)
    return None if markup == html.escape(text, quote=False) else markup


def _inline_html(segment: str) -> str:
    pieces = _INLINE_CODE.split(segment)  # odd positions are the insides of `code`
    out = []
    for index, piece in enumerate(pieces):
        escaped = html.escape(piece, quote=False)
        out.append(f"<code>{escaped}</code>" if index % 2 else _BOLD.sub(r"<b>\1</b>", escaped))
    return "".join(out)


# --- sending ---------------------------------------------------------------------------------------------------

def outgoing(text: str) -> str:
    """`text` fit to send: lone surrogates replaced (no request could encode one), secrets redacted."""
    return redact(clean_text(text))


async def send_text(bot: Bot, chat_id: int, text: str, *, reply_to: int | None = None,
                    thread_id: int | None = None, patience: float | None = None) -> list[Message]:
    """Send `text` split to Telegram's limit, the first piece replying to `reply_to`; returns what was sent.
    Each piece retries for `patience` seconds (see `send_chunk`)."""
    sent = []
    for index, chunk in enumerate(split_message(outgoing(text)) or ["…"]):
        sent.append(await send_chunk(bot, chat_id, chunk, reply_to=reply_to if index == 0 else None,
                                     thread_id=thread_id, patience=patience))
    return sent


async def send_chunk(bot: Bot, chat_id: int, chunk: str, *, reply_to: int | None = None,
                     thread_id: int | None = None, patience: float | None = None) -> Message:
    """Send one piece, formatted when it has Markdown; as plain text when Telegram refuses the formatting.

    Failures are retried for `patience` seconds (default SEND_PATIENCE_SECONDS).
    """
    reply = ReplyParameters(reply_to, allow_sending_without_reply=True) if reply_to else None
    chunk = outgoing(chunk)

    async def send(body: str, parse_mode: str | None) -> Message:
        return await bot.send_message(chat_id, body, parse_mode=parse_mode, reply_parameters=reply,
                                      message_thread_id=thread_id)

    markup = to_html(chunk)
    if markup is not None:
        try:
            return await with_retries(lambda: send(markup, ParseMode.HTML), patience)
        except BadRequest as error:
            log.info("formatted message refused (%s); sending it as plain text", error.message)
    return await with_retries(lambda: send(chunk, None), patience)


async def edit_chunk(message: Message, chunk: str, *, patience: float | None = None) -> None:
    """Change a sent message to `chunk`, formatted as `send_chunk` formats it (plain text when Telegram refuses the
    formatting); an edit that changes nothing counts as done."""
    chunk = outgoing(chunk)

    async def edit(body: str, parse_mode: str | None) -> None:
        try:
            await message.edit_text(body, parse_mode=parse_mode)
        except BadRequest as error:
            if "not modified" not in error.message.lower():
                raise

    markup = to_html(chunk)
    if markup is not None:
        try:
            return await with_retries(lambda: edit(markup, ParseMode.HTML), patience)
        except BadRequest as error:
            if not _formatting_refused(error):
                raise
            log.info("formatted edit refused (%s); editing as plain text", error.message)
    await with_retries(lambda: edit(chunk, None), patience)


async def send_draft(bot: Bot, chat_id: int, draft_id: int, chunk: str, *, thread_id: int | None = None,
                     patience: float | None = None) -> None:
    """Show `chunk` as the chat's draft `draft_id` (Bot API sendMessageDraft: private chats only), formatted as
    `send_chunk` formats it. A refusal (a server without drafts, a chat that cannot have one) is raised."""
    chunk = outgoing(chunk)

    async def draft(body: str, parse_mode: str | None) -> None:
        await bot.send_message_draft(chat_id, draft_id, body, message_thread_id=thread_id, parse_mode=parse_mode)

    markup = to_html(chunk)
    if markup is not None:
        try:
            return await with_retries(lambda: draft(markup, ParseMode.HTML), patience)
        except BadRequest as error:
            if not _formatting_refused(error):
                raise
    await with_retries(lambda: draft(chunk, None), patience)


def _formatting_refused(error: BadRequest) -> bool:
    """Whether Telegram refused the HTML itself (as opposed to the call)."""
    return "entit" in error.message.lower() or "parse" in error.message.lower()


async def with_retries(call: Callable[[], Awaitable[T]], patience: float | None = None) -> T:
    """Run a send, retrying after flood waits and network failures for up to `patience` seconds (default
    SEND_PATIENCE_SECONDS); refusals such as BadRequest are not retried."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (SEND_PATIENCE_SECONDS if patience is None else patience)
    attempt = 0
    while True:
        try:
            return await call()
        except (BadRequest, Forbidden):
            raise
        except (RetryAfter, NetworkError) as error:  # NetworkError includes TimedOut and 5xx answers
            pause = _pause_before_retry(error, attempt)
            if loop.time() + pause > deadline:
                raise
            log.info("sending failed (%s); retrying in %g s", error, pause)
        await asyncio.sleep(pause)
        attempt += 1


def _pause_before_retry(error: TelegramError, attempt: int) -> float:
    """What Telegram asked for after a flood wait; a growing back-off after a network failure."""
    if isinstance(error, RetryAfter):
        return retry_after_seconds(error)
    return RETRY_PAUSES_SECONDS[min(attempt, len(RETRY_PAUSES_SECONDS) - 1)]


def retry_after_seconds(error: RetryAfter) -> float:
    """The wait Telegram asked for, in seconds."""
    # `RetryAfter.retry_after` warns about its changing type in v22; the timedelta behind it does not.
    value = getattr(error, "_retry_after", None)
    return value.total_seconds() if value is not None else 1.0


async def quietly(call: Awaitable[object], what: str) -> object | None:
    """Await an auxiliary call; a failure is logged and ignored."""
    try:
        return await call
    except TelegramError as error:
        log.info("%s failed: %s", what, error)
        return None


# --- while a turn runs -----------------------------------------------------------------------------------------

class TurnFeedback:
    """Typing every few seconds; after `progress_after` seconds, one progress message showing the current step.

    Use as `async with TurnFeedback(...) as feedback:` and call `feedback.show(step)` when a step starts (it only
    notes the step: the feedback's own task edits the message). After the answer is sent, `remove()` deletes the
    progress message. With a `ledger` (bot/telegram/progress.py), the progress message is listed in the database
    while it is on screen, so a killed process's is deleted at the next start.
    """

    def __init__(self, bot: Bot, chat_id: int, *, placeholder: str, reply_to: int | None = None,
                 thread_id: int | None = None, typing_every: float = StreamingSettings.typing_interval_seconds,
                 progress_after: float = StreamingSettings.progress_after_seconds,
                 ledger: ProgressLedger | None = None):
        self.bot = bot
        self.ledger = ledger
        self.chat_id = chat_id
        self.reply_to = reply_to
        self.thread_id = thread_id
        self.typing_every = typing_every
        self.progress_after = progress_after
        self.step = placeholder
        self.progress: Message | None = None
        self._shown = ""
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "TurnFeedback":
        self._task = asyncio.create_task(self._run(), name=f"feedback:{self.chat_id}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def show(self, step: str) -> None:
        """The agent started a step: the progress message, once there is one, shows it next."""
        self.step = step
        self._changed.set()

    async def stop(self) -> None:
        """Stop typing and progress updates (the progress message stays until `remove`)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def remove(self) -> None:
        """Delete the progress message, if one was sent (still listed if that failed: the next start retries)."""
        async with self._lock:
            if self.progress is not None:
                deleted = await quietly(self.progress.delete(), "deleting the progress message")
                if deleted and self.ledger is not None and self.progress is not _NO_MESSAGE:
                    await self.ledger.forget(self.chat_id, self.progress.message_id)
                self.progress = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        progress_at = loop.time() + self.progress_after
        next_typing = loop.time()
        while True:
            self._changed.clear()  # before looking, so a step shown meanwhile wakes the wait below
            if loop.time() >= next_typing:
                await quietly(self.bot.send_chat_action(self.chat_id, ChatAction.TYPING,
                                                        message_thread_id=self.thread_id), "sendChatAction")
                next_typing = loop.time() + self.typing_every
            if loop.time() >= progress_at:
                await self._update_progress()
            wake = next_typing if self.progress is not None else min(next_typing, progress_at)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), max(0.0, wake - loop.time()))

    async def _update_progress(self) -> None:
        async with self._lock:
            text = self.step
            if text == self._shown and self.progress is not None:
                return
            if self.progress is None:
                self.progress = await quietly(send_chunk(self.bot, self.chat_id, text, reply_to=self.reply_to,
                                                         thread_id=self.thread_id,
                                                         patience=PROGRESS_PATIENCE_SECONDS),
                                              "sending the progress message")
                # A failed progress message is not retried: the answer matters, the progress does not.
                if self.progress is None:
                    self.progress = _NO_MESSAGE
                elif self.ledger is not None:
                    await self.ledger.remember(self.chat_id, self.progress.message_id)
            elif self.progress is not _NO_MESSAGE:
                await quietly(self.progress.edit_text(outgoing(text)), "editing the progress message")
            self._shown = text


class _Missing:
    """Stands for a progress message that could not be sent: nothing to edit or delete."""

    async def delete(self) -> bool:
        return True

    async def edit_text(self, text: str) -> None:
        return None


_NO_MESSAGE: Message = _Missing()  # type: ignore[assignment]


# --- what the user commands show -------------------------------------------------------------------------------

def trace_text(turn: StoredTurn | None, lang: str) -> str:
    """/trace: a stored turn's question (🎤 a transcript, 🖼 about a picture), its steps (tool, input, observation,
    time) and answer, long texts shortened; or that there is none."""
    if turn is None:
        return text("no_trace", lang)
    asked = {"voice": "🎤", "photo": "🖼"}.get(turn.input_kind, "❓")  # a transcript, a question about a picture
    lines = [text("trace_header", lang, status=turn.status, seconds=turn.duration_ms / 1000), f"{asked} {turn.question}"]
    if steps := render_trace(turn.steps, compact=True):
        lines.append(steps)
    if not any(step.kind in TOOL_KINDS for step in turn.steps):
        lines.append(text("trace_no_steps", lang))
    lines.append(f"💬 {shorten(turn.answer)}")
    return "\n".join(lines)


def tools_text(enabled: Sequence[Tool], lang: str) -> str:
    """/tools: the tools enabled in a chat, or that there is none."""
    lines = [f"• {tool.name} — {tool.human_name}" for tool in enabled]
    return "\n".join([text("tools_header", lang), *lines]) if lines else text("no_tools", lang)
