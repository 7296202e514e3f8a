"""A backend that replays given outputs in order: the model for tests and demos.

Each scripted entry is the raw text a model would produce (stop strings included, as a real model emits them;
they are trimmed here exactly as a real backend trims them), an exception to raise, or a function of the
request returning text. Every request is recorded so tests can assert on the prompt the model saw.

Background calls (`Priority.LOW`: history summaries) do not take from the script: they are answered by
`background` (a reply, or a function of the request), so a test's script stays the turns' own whenever a summary
runs. The default background reply is a fixed summary line.

Streaming, like a server: a caller's `on_text` gets the reply as trimmed at the stop string, after `delay`; with
`token_seconds`, piece by piece (a word, or up to three characters of unspaced text such as Chinese) with that
pause between pieces, so tests can watch an answer grow; without it, all at once.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, Union

from agent.errors import LLMCancelled, LLMError
from agent.grammar import Grammar
from agent.images import text_of
from agent.llm.base import LLM, CancelToken, Completion, Message, ModelRequest, Priority, TextSink, trim_at_stop
from agent.tokens import TokenCounter, estimate_tokens


@dataclass(frozen=True)
class Request:
    """One call the agent made: what a real model would have been given."""

    messages: list[Message]
    stop: tuple[str, ...]
    max_new_tokens: int
    tools: list[dict[str, Any]] | None
    grammar: Grammar | None = None
    user_key: str = ""
    priority: Priority = Priority.NORMAL

    @property
    def last_content(self) -> str:
        """The text of the final message (the ReAct prompt plus trace, in ReAct mode)."""
        return text_of(self.messages[-1].get("content"))

    @property
    def text(self) -> str:
        """Every message's content joined, for 'does the prompt mention X' assertions."""
        return "\n".join(text_of(m.get("content")) for m in self.messages)

    @property
    def pictures(self) -> list[dict[str, Any]]:
        """The picture parts the messages carry, in order."""
        return [part for m in self.messages if isinstance(m.get("content"), list)
                for part in m["content"] if part.get("type") == "image_url"]


Reply = Union[str, Completion, BaseException, Callable[[Request], Union[str, Completion]]]

_PIECE = re.compile(r"\s*\S{1,3}|\s+")  # what one streamed "token" of a scripted reply is


def stream_pieces(text: str) -> list[str]:
    """`text` cut into token-sized pieces that join back into it exactly."""
    return _PIECE.findall(text)


DEFAULT_BACKGROUND_REPLY = "The user and the assistant talked about earlier questions."


class ScriptedLLM(LLM):
    """Replays `replies` in order; raises `LLMError` when the script runs out. Background (LOW) calls get
    `background` instead."""

    name = "scripted"

    def __init__(self, replies: Sequence[Reply] = (), *, delay: float = 0.0, token_seconds: float = 0.0,
                 count_tokens: TokenCounter = estimate_tokens, background: Reply = DEFAULT_BACKGROUND_REPLY,
                 sees_images: bool = False):
        self.replies = list(replies)
        self.background = background
        self.vision = sees_images  # tests of questions about pictures script a model that can see
        self.delay = delay
        self.token_seconds = token_seconds
        self.requests: list[Request] = []
        self._count = count_tokens

    @classmethod
    def from_file(cls, path: str | Path, **kwargs: Any) -> "ScriptedLLM":
        """Load replies from a JSON list of strings (the `SCRIPTED_REPLIES_PATH` setting)."""
        try:
            replies = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise LLMError(f"cannot read scripted replies from {path}: {error}") from None
        if not isinstance(replies, list) or not all(isinstance(r, str) for r in replies):
            raise LLMError(f"{path} must hold a JSON list of strings")
        return cls(replies, **kwargs)

    @property
    def sees_images(self) -> bool:
        """Whether the scripted model plays one that can see (`sees_images=`)."""
        return self.vision

    def add(self, *replies: Reply) -> None:
        """Queue more replies."""
        self.replies.extend(replies)

    def count_tokens(self, text: str) -> int:
        return self._count(text)

    async def complete(self, request: ModelRequest) -> Completion:
        """The next scripted reply, after `delay`; streamed to the request's `on_text` when given. The request
        (grammar included) is recorded; the grammar is not applied."""
        recorded = Request([dict(m) for m in request.messages], tuple(request.stop), request.max_new_tokens,
                           list(request.tools) if request.tools else None, request.grammar, request.user_key,
                           request.priority)
        self.requests.append(recorded)
        if self.delay:
            await self._sleep_unless_cancelled(request.cancel, self.delay)
        completion = self._next_completion(recorded, request.messages, request.stop)
        if request.on_text is not None:
            await self._stream(completion.text, request.on_text, request.cancel)
        return self.counters.count(completion)

    def _next_completion(self, request: Request, messages: Sequence[Message], stop: Sequence[str]) -> Completion:
        if request.priority == Priority.LOW:
            reply = self.background
        elif not self.replies:
            raise LLMError("scripted model has no more replies")
        else:
            reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply):
            reply = reply(request)
        if isinstance(reply, Completion):
            return reply
        text, stopped = trim_at_stop(reply, stop)
        prompt_tokens = sum(self._count(text_of(m.get("content"))) for m in messages)
        return Completion(text, prompt_tokens, self._count(text), "stop" if stopped or text == reply else "length")

    async def _stream(self, text: str, on_text: TextSink, cancel: CancelToken | None) -> None:
        if not self.token_seconds:
            if text:
                on_text(text)
            return
        for index, piece in enumerate(stream_pieces(text)):
            if index:
                await self._sleep_unless_cancelled(cancel, self.token_seconds)
            on_text(piece)

    async def _sleep_unless_cancelled(self, cancel: CancelToken | None, seconds: float) -> None:
        # Sleep in small slices so a cancelled request ends promptly, as a real backend's does.
        deadline = asyncio.get_running_loop().time() + seconds
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            if cancel is not None and cancel.cancelled:
                raise LLMCancelled("cancelled")
            await asyncio.sleep(min(left, 0.01))
