"""The one small interface every model backend implements.

A request is a list of chat messages (`{"role": ..., "content": ...}`). When the last message is from the
assistant, the backend *continues* it rather than starting a new assistant turn: that is how the ReAct trace
grows inside one assistant turn. Stop strings end generation and are not part of the returned text.

A call is one `ModelRequest`: the messages and everything that shapes or steers the reply.

Streaming: a caller that sets `on_text` is handed each piece of new text as it is generated, on the event loop.
The pieces are a preview: they may run a little past a stop string (a backend sees the stop only once it is
complete), so the returned `Completion` stays the authority on what the model said.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from agent.grammar import Grammar

Message = dict[str, Any]
# Called on the event loop with each new piece of generated text; it must be quick and must not block.
TextSink = Callable[[str], None]

# The values of MODEL_DTYPE: `auto` lets the backend choose for the hardware it runs on.
MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8", "int4")
# Tokens one model call may generate unless told otherwise (MAX_NEW_TOKENS: AgentLimits reads it here).
MAX_NEW_TOKENS = 512


class Priority(StrEnum):
    """Who waits for a call: a person (`NORMAL`), or nobody right now (`LOW`: a background job such as a history
    summary, which a backend runs only in capacity no person's call is using)."""

    NORMAL = "normal"
    LOW = "low"


@dataclass(frozen=True)
class ModelRequest:
    """One model call: the chat to continue, where to stop, and how the caller steers and listens to it.

    `tools` are OpenAI-style function specs for native tool calling. `on_text`, when given, receives the new text as
    it is generated (see the module docstring). `grammar`, when given, is what the reply must look like
    (agent/grammar.py); a backend that cannot apply it generates without it. `cancel` stops the call at its next
    step. A conversation makes the first four (agent/conversations.py); the agent's loop adds the rest (`replace`).

    `user_key` says whose call it is (a user, or a session when no user is known): a backend that queues calls
    shares its capacity fairly among the keys waiting (engine/admission.py). `priority` LOW marks a call nobody is
    waiting for.
    """

    messages: Sequence[Message]
    stop: Sequence[str] = ()
    tools: Sequence[dict[str, Any]] | None = None
    grammar: "Grammar | None" = None
    max_new_tokens: int = MAX_NEW_TOKENS
    cancel: "CancelToken | None" = None
    on_text: TextSink | None = None
    user_key: str = ""
    priority: Priority = Priority.NORMAL


@dataclass(frozen=True)
class ToolCall:
    """A tool call the server parsed for us (OpenAI-compatible native mode)."""

    name: str
    arguments: str  # raw JSON text, exactly as the model wrote it
    id: str = ""


@dataclass(frozen=True)
class Completion:
    """What one model call produced."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"  # "stop" (stop string or end of turn), "length" or "cancelled"
    tool_calls: tuple[ToolCall, ...] = field(default_factory=tuple)
    cached_tokens: int = 0  # prompt tokens whose KV was reused rather than computed (a prefix cache)


class CancelToken:
    """Set from the event loop, read from the model thread: `threading.Event` is safe across both."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        """Ask the running request to stop at its next step."""
        self._event.set()

    @property
    def cancelled(self) -> bool:
        """Whether `cancel()` was called."""
        return self._event.is_set()


@dataclass
class ModelCounters:
    """Plain counters of a backend's work since it started, for whoever reports them (the bot's /metrics reads a
    `snapshot` from another thread). Token counts come from each call's `Completion`, on the event loop; the local
    engine's batch and speculative counts from its model thread; each count has one writer."""

    generated_tokens: int = 0
    prompt_tokens_computed: int = 0
    prompt_tokens_reused: int = 0  # taken from a cached prefix (the engine's prefix store, a server's cache)
    speculative_proposed: int = 0
    speculative_accepted: int = 0
    batches: int = 0
    batch_rows_total: int = 0  # rows of all the batches started
    batch_rows: int = 0  # rows of the batch running now
    queued_jobs: Callable[[], int] | None = None  # model calls waiting now (a backend with a queue sets it)

    def count(self, completion: "Completion") -> "Completion":
        """Add one call's tokens; returns the completion, for `return llm.counters.count(...)`."""
        self.generated_tokens += completion.completion_tokens
        self.prompt_tokens_reused += completion.cached_tokens
        self.prompt_tokens_computed += max(0, completion.prompt_tokens - completion.cached_tokens)
        return completion

    def snapshot(self) -> "CountersSnapshot":
        """The counts now, the queue read at this moment."""
        return CountersSnapshot(self.generated_tokens, self.prompt_tokens_computed, self.prompt_tokens_reused,
                                self.speculative_proposed, self.speculative_accepted, self.batches,
                                self.batch_rows_total, self.batch_rows,
                                self.queued_jobs() if self.queued_jobs is not None else 0)


@dataclass(frozen=True)
class CountersSnapshot:
    """`ModelCounters` at one moment."""

    generated_tokens: int
    prompt_tokens_computed: int
    prompt_tokens_reused: int
    speculative_proposed: int
    speculative_accepted: int
    batches: int
    batch_rows_total: int
    batch_rows: int
    queued_jobs: int


@dataclass(frozen=True)
class ModelActivity:
    """Whether a backend's own worker (the local engine's model thread) is alive, has work, and how long ago it
    last made progress: what a health check needs to call it stuck."""

    alive: bool
    working: bool  # calls queued or running
    seconds_since_progress: float  # since its last step (or since it became idle)
    detail: str = ""


class LLM(ABC):
    """An async model backend."""

    name: str = "llm"

    @property
    def counters(self) -> ModelCounters:
        """This backend's counters (made on first use, so that backends need no constructor call for them)."""
        if "_counters" not in self.__dict__:
            self.__dict__["_counters"] = ModelCounters()
        return self.__dict__["_counters"]

    def activity(self) -> ModelActivity | None:
        """The state of the backend's own worker thread; None for backends without one (a server, a script)."""
        return None
    def sees_images(self) -> bool:
        """Whether a question's pictures may go to this model (agent/images.py): False for a model that reads text
        only, as the local engine's models do; the caller then tells the user rather than sending them."""
        return False

    async def start(self) -> None:
        """Load weights, open clients: anything slow that should happen once at start-up."""

    async def close(self) -> None:
        """Release what `start` took."""

    @abstractmethod
    async def complete(self, request: ModelRequest) -> Completion:
        """Generate a completion for `request.messages`, ending at the first of its stop strings (trimmed) or its
        token limit (`ModelRequest` says what each field does). Raises `LLMError` subclasses."""

    @abstractmethod
    def count_tokens(self, text: str) -> int:
        """Count tokens of `text` as this model sees them; cheap and safe to call from the event loop."""


def trim_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut `text` before the earliest stop string; say whether one was found."""
    cut = min((index for s in stop if s and (index := text.find(s)) >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
