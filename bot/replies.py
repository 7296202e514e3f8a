"""Telegram-shaped output: 4096-character splitting, safe formatting, typing and progress while a turn runs.

The rule everywhere here: an auxiliary call (typing, a progress message, an edit, a deletion) may fail and the
answer still goes out; formatting Telegram refuses is sent again as plain text.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import re
from typing import Awaitable, Callable, Sequence

from telegram import Bot, Message, ReplyParameters
from telegram.constants import ChatAction, MessageLimit, ParseMode
from telegram.error import BadRequest, Forbidden, NetworkError, RetryAfter, TelegramError

from agent.memory import StoredTurn
from agent.steps import TOOL_KINDS
from agent.traces import render_trace, shorten
from bot.i18n import text
from tools.registry import Tool

log = logging.getLogger(__name__)

MAX_MESSAGE = MessageLimit.MAX_TEXT_LENGTH  # 4096, counted by Telegram in UTF-16 code units
# How long an answer keeps trying through flood waits and network failures: Telegram's 502s and dropped
# connections come in bursts of seconds, and an answer given up on is an answer lost (its turn is stored already).
SEND_PATIENCE_SECONDS = 30.0
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

async def send_text(bot: Bot, chat_id: int, text: str, *, reply_to: int | None = None,
                    thread_id: int | None = None) -> list[Message]:
    """Send `text` split to Telegram's limit, the first piece replying to `reply_to`; returns what was sent."""
    sent = []
    for index, chunk in enumerate(split_message(text) or ["…"]):
        sent.append(await send_chunk(bot, chat_id, chunk, reply_to=reply_to if index == 0 else None,
                                     thread_id=thread_id))
    return sent


async def send_chunk(bot: Bot, chat_id: int, chunk: str, *, reply_to: int | None = None,
                     thread_id: int | None = None, patience: float | None = None) -> Message:
    """Send one piece, formatted when it has Markdown; as plain text when Telegram refuses the formatting.

    Failures are retried for `patience` seconds (default SEND_PATIENCE_SECONDS).
    """
    reply = ReplyParameters(reply_to, allow_sending_without_reply=True) if reply_to else None

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


async def with_retries(call: Callable[[], Awaitable[Message]], patience: float | None = None) -> Message:
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

    Use as `async with TurnFeedback(...) as feedback:` and pass `feedback.show` as the agent's `on_progress`.
    After the answer is sent, `remove()` deletes the progress message.
    """

    def __init__(self, bot: Bot, chat_id: int, *, placeholder: str, reply_to: int | None = None,
                 thread_id: int | None = None, typing_every: float = 4.0, progress_after: float = 2.0):
        self.bot = bot
        self.chat_id = chat_id
        self.reply_to = reply_to
        self.thread_id = thread_id
        self.typing_every = typing_every
        self.progress_after = progress_after
        self.step = placeholder
        self.progress: Message | None = None
        self._shown = ""
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "TurnFeedback":
        self._task = asyncio.create_task(self._run(), name=f"feedback:{self.chat_id}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def show(self, step: str) -> None:
        """The agent started a step: remember it, and update the progress message if there is one."""
        self.step = step
        if self.progress is not None:
            await self._update_progress()

    async def stop(self) -> None:
        """Stop typing and progress updates (the progress message stays until `remove`)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def remove(self) -> None:
        """Delete the progress message, if one was sent."""
        async with self._lock:
            if self.progress is not None:
                await quietly(self.progress.delete(), "deleting the progress message")
                self.progress = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        progress_at = loop.time() + self.progress_after
        while True:
            await quietly(self.bot.send_chat_action(self.chat_id, ChatAction.TYPING,
                                                    message_thread_id=self.thread_id), "sendChatAction")
            next_typing = loop.time() + self.typing_every
            while loop.time() < next_typing:
                if self.progress is None and loop.time() >= progress_at:
                    await self._update_progress()
                wake = next_typing if self.progress is not None else min(next_typing, progress_at)
                await asyncio.sleep(max(0.0, wake - loop.time()))

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
            elif self.progress is not _NO_MESSAGE:
                await quietly(self.progress.edit_text(text), "editing the progress message")
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
    """/trace: a stored turn's steps (tool, input, observation, time), long texts shortened; or that there is none."""
    if turn is None:
        return text("no_trace", lang)
    lines = [text("trace_header", lang, status=turn.status, seconds=turn.duration_ms / 1000), f"❓ {turn.question}"]
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
