"""An answer streamed into Telegram while the model writes it, then delivered whole and formatted.

In a private chat the growing answer is a draft (Bot API `sendMessageDraft`): Telegram animates it in place, and it
leaves no trace until the real message is sent. Where there are no drafts (groups; a Bot API server without them;
a chat that refuses one) the answer is one real message, sent once the answer has been growing for `interval`
(an answer done sooner is sent once, whole, never edited) and edited as it grows. Either
way updates go out at most once per `interval` per chat (Telegram allows about one message per second in a chat,
twenty per minute in a group; edits count), always the latest text, so a fast model skips states rather than
queueing them; the bot's rate limiter stays in charge of every call underneath.

A long answer is cut as the final one will be (`split_message`): once a piece is complete it is sent as a real
message, and only the last piece is live. At the end the answer, formatted, replaces what was shown: edited where a
streamed message shows it, sent where none does. A stopped answer keeps what was shown, marked as stopped.

Every update is best effort: one that fails is skipped (the next carries the latest text), and the answer itself
goes out with the full patience of `send_chunk`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from telegram import Bot, Message
from telegram.error import BadRequest, Forbidden, InvalidToken, TelegramError

from bot.telegram.replies import (MAX_MESSAGE, PROGRESS_PATIENCE_SECONDS, edit_chunk, outgoing, quietly, send_chunk,
                         send_draft, split_message, utf16_len)

log = logging.getLogger(__name__)


@dataclass
class DraftSupport:
    """Whether the Bot API server takes drafts at all: one that answers "Not Found" is not asked again."""

    available: bool = True


@dataclass(frozen=True)
class StreamTarget:
    """Where a streamed answer goes."""

    chat_id: int
    reply_to: int | None = None
    thread_id: int | None = None
    draft_id: int | None = None  # a private chat's draft (the question's message id); None: edit a message


class AnswerStream:
    """One turn's answer as it is written: `show(text)` as it grows, then `finish(answer)` or `stop(note)`.

    Use as `async with AnswerStream(...) as stream:`; leaving the block stops the updates, nothing more.
    """

    def __init__(self, bot: Bot, target: StreamTarget, *, interval: float, drafts: DraftSupport,
                 patience: float | None = None):
        self.bot = bot
        self.target = target
        self.interval = interval
        self.patience = patience  # of the final answer (None: send_chunk's default); updates have a short one
        self.drafts = drafts
        self.use_drafts = target.draft_id is not None and drafts.available
        self.messages: list[Message] = []  # real messages showing the answer so far, one per piece
        self.shown: list[str] = []  # the text each of them shows
        self.draft_text = ""
        self.first_shown: float | None = None  # time.monotonic() when the answer's first text reached the screen
        self._latest = ""
        self._last_update = float("-inf")  # loop time of the last update sent (the pace applies to the final too)
        self._changed = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "AnswerStream":
        self._task = asyncio.create_task(self._run(), name=f"answer-stream:{self.target.chat_id}")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stop_updates()

    def show(self, text: str) -> None:
        """The answer so far (called on every change; cheap): the next update shows the latest."""
        self._latest = outgoing(text)  # redacted before it is split: a piece then keeps its length
        self._changed.set()

    async def finish(self, answer: str) -> list[Message]:
        """Deliver the whole answer, formatted and split, over what the stream showed; returns its messages.

        Raises what `send_chunk` raises when Telegram stays unreachable (the caller keeps the update for later).
        """
        await self._stop_updates()
        pieces = split_message(outgoing(answer)) or ["…"]
        if any(index < len(self.messages) and self.shown[index] != piece for index, piece in enumerate(pieces)):
            await self._keep_pace()
        for index, piece in enumerate(pieces):
            await self._deliver(index, piece)
        for extra in self.messages[len(pieces):]:
            await quietly(extra.delete(), "deleting a streamed message")
        del self.messages[len(pieces):], self.shown[len(pieces):]
        return list(self.messages)

    async def stop(self, note: str) -> None:
        """The answer will not be finished (/cancel, shutdown, a failure): what was shown stays, marked with `note`.

        A draft needs nothing: it was never a message, and Telegram drops it.
        """
        await self._stop_updates()
        if not self.messages:
            return
        kept = self.shown[-1]
        suffix = f"…\n\n{note}"
        while kept and utf16_len(kept + suffix) > MAX_MESSAGE:
            kept = kept[: -max(1, len(kept) // 10)]
        await quietly(edit_chunk(self.messages[-1], kept + suffix, patience=PROGRESS_PATIENCE_SECONDS),
                      "marking the streamed answer as stopped")

    # --- the updates, on their own task ---------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._closing.is_set():
            await self._changed.wait()
            if not self.use_drafts and not self.messages:
                # A message is sent only for an answer still being written `interval` after its first text: a
                # quick answer goes out once, whole and formatted, with no edit to wait for.
                await self._pause()
            self._changed.clear()
            if self._closing.is_set():
                return
            await self._update(self._latest)
            self._last_update = asyncio.get_running_loop().time()
            await self._pause()

    async def _pause(self) -> None:
        """Wait `interval`, or less when the stream is closed meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), self.interval)

    async def _keep_pace(self) -> None:
        """Wait until `interval` has passed since the last update, before the final answer edits what streamed
        (one more edit in this chat). Drafts need no wait: a draft is no message."""
        await asyncio.sleep(max(0.0, self._last_update + self.interval - asyncio.get_running_loop().time()))

    async def _stop_updates(self) -> None:
        """End the update task; an update in flight completes first, so no message is sent twice."""
        self._closing.set()
        self._changed.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def _update(self, text: str) -> None:
        pieces = split_message(text)
        if not pieces:
            await self._take_back()
            return
        for index, piece in enumerate(pieces[:-1]):
            await self._put(index, piece)
        live = len(pieces) - 1
        if self.use_drafts and live >= len(self.messages):
            await self._draft(pieces[-1])
            if self.use_drafts:
                return
        await self._put(live, pieces[-1])

    async def _draft(self, piece: str) -> None:
        if piece == self.draft_text:
            return
        try:
            await send_draft(self.bot, self.target.chat_id, self.target.draft_id or 0, piece,
                             thread_id=self.target.thread_id, patience=PROGRESS_PATIENCE_SECONDS)
        except (BadRequest, Forbidden, InvalidToken) as error:
            # Refused: this chat (or this Bot API server) has no drafts. The answer goes on as an edited message.
            log.info("drafts refused (%s); streaming by editing a message instead", error)
            self.use_drafts = False
            if isinstance(error, InvalidToken):  # "Not Found": the server does not know the method at all
                self.drafts.available = False
            return
        except TelegramError as error:  # a network failure or a flood wait: the next update tries again
            log.info("a draft update failed (%s); the next one carries the latest text", error)
            return
        self.draft_text = piece
        self._shown()

    async def _put(self, index: int, piece: str) -> None:
        """Make real message `index` show `piece` (edit it, or send it); a failure waits for the next update."""
        if index < len(self.messages):
            if self.shown[index] != piece:
                try:
                    await edit_chunk(self.messages[index], piece, patience=PROGRESS_PATIENCE_SECONDS)
                except TelegramError as error:
                    log.info("editing the streamed answer failed: %s", error)
                    return
                self.shown[index] = piece
            return
        message = await quietly(self._send(index, piece, PROGRESS_PATIENCE_SECONDS), "sending a streamed message")
        if message is not None:
            self.messages.append(message)  # type: ignore[arg-type]
            self.shown.append(piece)

    async def _deliver(self, index: int, piece: str) -> None:
        """Make message `index` show the final `piece`, with the full patience of an answer."""
        if index < len(self.messages):
            if self.shown[index] == piece:
                return
            try:
                await edit_chunk(self.messages[index], piece, patience=self.patience)
                self.shown[index] = piece
                return
            except BadRequest as error:  # the message is gone (deleted by someone): send the piece anew
                log.info("the streamed message cannot be edited (%s); sending the answer anew", error.message)
            self.messages[index] = await self._send(index, piece, self.patience)
            self.shown[index] = piece
            return
        self.messages.append(await self._send(index, piece, self.patience))
        self.shown.append(piece)

    async def _send(self, index: int, piece: str, patience: float | None) -> Message:
        reply_to = self.target.reply_to if index == 0 else None
        message = await send_chunk(self.bot, self.target.chat_id, piece, reply_to=reply_to,
                                   thread_id=self.target.thread_id, patience=patience)
        self._shown()
        return message

    def _shown(self) -> None:
        """Text of the answer is on the user's screen now (the first time counts, for the metrics)."""
        if self.first_shown is None:
            self.first_shown = time.monotonic()

    async def _take_back(self) -> None:
        """The text shown was not the answer after all: remove the messages showing it, empty the draft (which
        then shows Telegram's "thinking" placeholder)."""
        for message in self.messages:
            await quietly(message.delete(), "deleting a streamed message")
        self.messages.clear()
        self.shown.clear()
        if self.use_drafts and self.draft_text:
            await self._draft("")
