"""A backend that replays given outputs in order: the model for tests and demos.

Each scripted entry is the raw text a model would produce (stop strings included, as a real model emits them;
they are trimmed here exactly as a real backend trims them), an exception to raise, or a function of the
request returning text. Every request is recorded so tests can assert on the prompt the model saw.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, Union

from agent.errors import LLMCancelled, LLMError
from agent.grammar import Grammar
from agent.llm.base import LLM, CancelToken, Completion, Message, trim_at_stop
from agent.tokens import TokenCounter, estimate_tokens


@dataclass(frozen=True)
class Request:
    """One call the agent made: what a real model would have been given."""

    messages: list[Message]
    stop: tuple[str, ...]
    max_new_tokens: int
    tools: list[dict[str, Any]] | None
    grammar: Grammar | None = None

    @property
    def last_content(self) -> str:
        """The text of the final message (the ReAct prompt plus trace, in ReAct mode)."""
        return str(self.messages[-1].get("content") or "")

    @property
    def text(self) -> str:
        """Every message's content joined, for 'does the prompt mention X' assertions."""
        return "\n".join(str(m.get("content") or "") for m in self.messages)


Reply = Union[str, Completion, BaseException, Callable[[Request], Union[str, Completion]]]


class ScriptedLLM(LLM):
    """Replays `replies` in order; raises `LLMError` when the script runs out."""

    name = "scripted"

    def __init__(self, replies: Sequence[Reply] = (), *, delay: float = 0.0, count_tokens: TokenCounter = estimate_tokens):
        self.replies = list(replies)
        self.delay = delay
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

    def add(self, *replies: Reply) -> None:
        """Queue more replies."""
        self.replies.extend(replies)

    def count_tokens(self, text: str) -> int:
        return self._count(text)

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        stop: Sequence[str] = (),
        max_new_tokens: int = 512,
        tools: Sequence[dict[str, Any]] | None = None,
        cancel: CancelToken | None = None,
        grammar: Grammar | None = None,
    ) -> Completion:
        """The next scripted reply; the request (grammar included) is recorded. The grammar is not applied."""
        request = Request([dict(m) for m in messages], tuple(stop), max_new_tokens, list(tools) if tools else None,
                          grammar)
        self.requests.append(request)
        if self.delay:
            await self._sleep_unless_cancelled(cancel)
        if not self.replies:
            raise LLMError("scripted model has no more replies")
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply):
            reply = reply(request)
        if isinstance(reply, Completion):
            return reply
        text, stopped = trim_at_stop(reply, stop)
        prompt_tokens = sum(self._count(str(m.get("content") or "")) for m in messages)
        return Completion(text, prompt_tokens, self._count(text), "stop" if stopped or text == reply else "length")

    async def _sleep_unless_cancelled(self, cancel: CancelToken | None) -> None:
        # Sleep in small slices so a cancelled request ends promptly, as a real backend's does.
        deadline = asyncio.get_running_loop().time() + self.delay
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            if cancel is not None and cancel.cancelled:
                raise LLMCancelled("cancelled")
            await asyncio.sleep(min(left, 0.01))
