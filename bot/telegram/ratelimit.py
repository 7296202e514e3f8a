"""Outgoing rate limits: python-telegram-bot's `AIORateLimiter`, with three changes for a bot many chats share.

- A flood wait (429 `RetryAfter`) pauses the chat it was for, not the whole bot: `AIORateLimiter` pauses every
  request for `retry_after` seconds, so one busy group (or one chat Telegram throttles) would hold up every answer
  in every other chat. Requests without a chat (`getUpdates`, `setMyCommands`) keep PTB's bot-wide pause.
- Chat actions ("typing…") skip the budgets: they are not messages, and a group's 20 per minute belong to answers.
- A request sent with `rate_limit_args=SPARE_ONLY` (a refusal to a stranger) goes out only if it leaves at least
  half of the budgets it uses free, and is otherwise dropped (`NoSpareCapacity`): such messages never make an
  answer wait. Checking and taking the capacity happen without a pause in between, so a burst cannot overdraw.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Callable, Coroutine

from telegram.error import RetryAfter, TelegramError
from telegram.ext import AIORateLimiter

from bot.telegram.replies import retry_after_seconds

log = logging.getLogger(__name__)

SPARE_ONLY = "spare-only"  # the `rate_limit_args` of a message that may only use spare capacity
SPARE_FRACTION = 0.5  # how much of a budget must be free for such a message
RETRY_MARGIN_SECONDS = 0.1  # as PTB: a little more than Telegram asked for

Callback = Callable[..., Coroutine[Any, Any, Any]]


class NoSpareCapacity(TelegramError):
    """A spare-only message was not sent: the budgets it would use are busy with answers."""


class BotRateLimiter(AIORateLimiter):
    """`AIORateLimiter` with per-chat flood waits, free chat actions and spare-only messages (see the module)."""

    def __init__(self, overall_max_rate: float, group_max_rate: float, max_retries: int = 2):
        # PTB's own retry loop pauses everyone: ours (below) pauses the chat; PTB's stays for chat-less requests.
        super().__init__(overall_max_rate=overall_max_rate, group_max_rate=group_max_rate, max_retries=max_retries)
        self._chat_retries = max_retries
        self._paused_until: dict[int | str, float] = {}  # chat → loop time its flood wait ends

    async def process_request(self, callback: Callback, args: Any, kwargs: dict[str, Any], endpoint: str,
                              data: dict[str, Any], rate_limit_args: Any) -> Any:
        """Send one request within the budgets (see the class)."""
        if endpoint == "sendChatAction":
            return await callback(*args, **kwargs)
        chat_id = _chat_key(data.get("chat_id"))
        spare_only = rate_limit_args == SPARE_ONLY
        if chat_id is None:
            return await super().process_request(callback, args, kwargs, endpoint, data,
                                                  None if spare_only else rate_limit_args)
        retries = rate_limit_args if isinstance(rate_limit_args, int) else self._chat_retries
        for attempt in range(retries + 1):
            await self._chat_pause_over(chat_id)
            if spare_only and not self.has_spare(chat_id):
                raise NoSpareCapacity(f"no spare capacity to send to chat {chat_id} now")
            try:
                return await self._run_request(chat=True, group=_group_of(chat_id),
                                               allow_paid_broadcast=data.get("allow_paid_broadcast", False),
                                               callback=callback, args=args, kwargs=kwargs)
            except RetryAfter as error:
                if attempt == retries or spare_only:
                    raise
                self._pause_chat(chat_id, error)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def has_spare(self, chat_id: int | str) -> bool:
        """Whether one more message leaves SPARE_FRACTION of the overall budget, and of the chat's group budget, free."""
        if self._base_limiter is not None and not _has_fraction_free(self._base_limiter):
            return False
        group = _group_of(chat_id)
        if group is False or not self._group_max_rate:
            return True
        return _has_fraction_free(self._get_group_limiter(group))

    def _pause_chat(self, chat_id: int | str, error: RetryAfter) -> None:
        """Hold this chat's requests for as long as Telegram asked (other chats go on)."""
        loop = asyncio.get_running_loop()
        pause = retry_after_seconds(error) + RETRY_MARGIN_SECONDS
        now = loop.time()
        for chat, until in list(self._paused_until.items()):  # forget waits that are over: no growth per chat
            if until <= now:
                del self._paused_until[chat]
        self._paused_until[chat_id] = max(self._paused_until.get(chat_id, now), now + pause)
        log.info("Telegram asked to wait %.1f s before sending to chat %s; other chats go on", pause, chat_id)

    async def _chat_pause_over(self, chat_id: int | str) -> None:
        loop = asyncio.get_running_loop()
        while (until := self._paused_until.get(chat_id)) is not None and until > loop.time():
            await asyncio.sleep(until - loop.time())


def _chat_key(chat_id: Any) -> int | str | None:
    """The chat a request is for, as PTB's limiter reads it (an int id, or an @channel name)."""
    if chat_id is None:
        return None
    with contextlib.suppress(ValueError, TypeError):
        return int(chat_id)
    return str(chat_id)


def _group_of(chat_id: int | str) -> int | str | bool:
    """The group budget a chat uses (groups and channels: negative ids or @names); False for private chats."""
    return chat_id if isinstance(chat_id, str) or chat_id < 0 else False


def _has_fraction_free(limiter: Any) -> bool:
    """Whether the limiter keeps SPARE_FRACTION of its budget free after one more message."""
    return limiter.has_capacity(min(limiter.max_rate, 1 + limiter.max_rate * SPARE_FRACTION))
