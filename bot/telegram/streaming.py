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
goes out with the full patience of `send_chunk`. An edit Telegram refuses outright (400: the message cannot be
edited, or is gone) ends the streaming: nothing more is shown until the end, when the pieces from the first one
that cannot be edited are sent anew, in order, and the stale streamed copies are deleted once they are through.
So the chat ends with exactly the answer's pieces, whatever Telegram refused on the way.

`finish` can be called again after it raised (Telegram unreachable): pieces already through are not sent twice.
Each piece is reported to `on_delivered` (index, message) once it shows its final text, so that a restart can
tell which pieces were sent (bot/telegram/deliveries.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from telegram import Bot, Message
from telegram.error import BadRequest, Forbidden, InvalidToken, TelegramError

from bot.telegram.replies import (MAX_MESSAGE, PROGRESS_PATIENCE_SECONDS, edit_chunk, outgoing, quietly, send_chunk,
                         send_draft, split_message, utf16_len)

log = logging.getLogger(__name__)


PieceSink = Callable[[int, Message], Awaitable[None]]  # a piece of the answer (its index) went through


class _SentEarlier:
    """Stands for a piece an earlier run delivered: nothing to edit or delete here."""

    async def delete(self) -> bool:
        return True


_SENT_EARLIER: Message = _SentEarlier()  # type: ignore[assignment]


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
                 patience: float | None = None, on_delivered: PieceSink | None = None):
        self.bot = bot
        self.target = target
        self.interval = interval
        self.patience = patience  # of the final answer (None: send_chunk's default); updates have a short one
        self.drafts = drafts
        self.on_delivered = on_delivered
        self.use_drafts = target.draft_id is not None and drafts.available
        self.messages: list[Message] = []  # real messages showing the answer so far, one per piece
        self.shown: list[str] = []  # the text each of them shows
        self.stale: list[Message] = []  # streamed messages replaced by pieces sent anew: deleted once those are through
        self.editable = True  # False once Telegram refused an edit outright: no more streaming
        self.reported: set[int] = set()  # pieces given to `on_delivered`
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

    async def finish(self, answer: str, *, already: int = 0) -> list[Message]:
        """Deliver the whole answer, formatted and split, over what the stream showed; returns its messages.

        `already`: how many leading pieces an earlier run delivered (a stored answer sent again): not sent again.
        Raises what `send_chunk` raises when Telegram stays unreachable; calling it again goes on where it stopped.
        """
        await self._stop_updates()
        pieces = split_message(outgoing(answer)) or ["…"]
        self._take_as_delivered(pieces[:already])
        if any(index < len(self.messages) and self.shown[index] != piece for index, piece in enumerate(pieces)):
            await self._keep_pace()
        for index, piece in enumerate(pieces):
            if not await self._deliver(index, piece):
                await self._send_anew(index, pieces)
                break
        self.stale.extend(self.messages[len(pieces):])
        del self.messages[len(pieces):], self.shown[len(pieces):]
        await self._delete_stale()
        return list(self.messages)

    def _take_as_delivered(self, pieces: list[str]) -> None:
        """Count the first pieces as shown, by messages an earlier run sent (only before anything is shown here)."""
        while len(self.messages) < len(pieces):
            self.messages.append(_SENT_EARLIER)
            self.shown.append(pieces[len(self.shown)])
            self.reported.add(len(self.shown) - 1)

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
        if not self.editable:
            return  # Telegram refused an edit outright: the rest goes once, at the end
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
                except BadRequest as error:
                    log.info("Telegram refused an edit of the streamed answer (%s); the rest is sent at the end",
                             error.message)
                    self.editable = False
                    return
                except TelegramError as error:
                    log.info("editing the streamed answer failed: %s", error)
                    return
                self.shown[index] = piece
            return
        message = await quietly(self._send(index, piece, PROGRESS_PATIENCE_SECONDS), "sending a streamed message")
        if message is not None:
            self.messages.append(message)  # type: ignore[arg-type]
            self.shown.append(piece)

    async def _deliver(self, index: int, piece: str) -> bool:
        """Make message `index` show the final `piece`, with the full patience of an answer; False when the
        streamed message showing it cannot be edited (refused, or deleted by someone)."""
        if index < len(self.messages):
            if self.shown[index] != piece:
                try:
                    await edit_chunk(self.messages[index], piece, patience=self.patience)
                except BadRequest as error:
                    log.info("the streamed message cannot be edited (%s); sending the answer anew", error.message)
                    return False
                self.shown[index] = piece
        else:
            self.messages.append(await self._send(index, piece, self.patience))
            self.shown.append(piece)
        await self._report(index)
        return True

    async def _send_anew(self, first: int, pieces: list[str]) -> None:
        """Send pieces `first`… as new messages, in order, after what is shown; the streamed messages they replace
        are deleted once all are through (`finish`), so a failure half-way leaves the chat no emptier."""
        self.stale.extend(self.messages[first:])
        del self.messages[first:], self.shown[first:]
        for index in range(first, len(pieces)):
            self.messages.append(await self._send(index, pieces[index], self.patience))
            self.shown.append(pieces[index])
            await self._report(index)

    async def _report(self, index: int) -> None:
        if self.on_delivered is not None and index not in self.reported:
            self.reported.add(index)
            await self.on_delivered(index, self.messages[index])

    async def _delete_stale(self) -> None:
        while self.stale:
            await quietly(self.stale.pop(0).delete(), "deleting a stale streamed message")

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
