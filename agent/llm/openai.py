"""The OpenAI-compatible backend: any chat-completions server (vLLM, SGLang, llama.cpp, Ollama, OpenAI itself).

Concurrency is the server's job: each call is one HTTP request on the official `openai` client's connection pool,
so many chats can be in flight at once and a vLLM deployment batches them across its GPUs.

Every call streams (`stream=True`): the caller sees text as it is generated, and the call runs under three time
limits instead of one deadline (agent/llm/openai_stream.py). Cancelling a call, or running out of time, closes its
stream: the connection drops, and vLLM, SGLang and llama.cpp stop generating for nobody. Retries are the client's
own (`max_retries`): exponential backoff from 0.5 s (capped at 8 s) on 408, 409, 429, 5xx and dropped
connections, honouring the server's Retry-After.

At start-up `GET /models` tells "not running" (connection refused, no such host) from "busy" (the connection opens
but the answer does not come: llama.cpp's Python server answers it only between generations); a busy server is
asked again, with growing patience, for up to `startup_seconds`. A server that refuses the connection fails the
start at once, unless `server_wait_seconds` gives it time: vLLM and Ollama in a container beside the bot listen only
once they are up (vLLM once its model is loaded, minutes), so the bot tries again every few seconds, saying so in
the log, for that long. A host that does not exist fails at once either way.

With `grammar` (OPENAI_GRAMMAR) each step's grammar goes with the request, in the field the server takes: vLLM's
structured outputs, SGLang's `ebnf`, llama.cpp's `grammar` (the latter two in llguidance's Lark, which they accept
when served with llguidance). A server that refuses it (400 or 422 with a grammar attached) gets the same request
again without one, and no grammar after that: the bot keeps answering, unconstrained, and says so once in the log.
A refusal is a status, which comes before any text, so nothing of the refused attempt was streamed.

Pictures (agent/images.py) go as `image_url` parts of the question's message when the model can see
(OPENAI_VISION): `on` says it can, `off` that it cannot (the bot then tells the user so, and sends nothing), and
`auto` sends them until the server refuses a request carrying one (400 or 422, as vLLM and SGLang answer for a
text-only model); that refusal is `ImagesRefused`, and no picture is sent after it (one warning in the log).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
import openai
from openai import AsyncOpenAI

from agent.errors import ImagesRefused, LLMCancelled, LLMError, LLMTimeout
from agent.grammar import Grammar
from agent.images import text_of
from agent.llm.base import (LLM, CancelToken, Completion, Message, ModelRequest, Priority, TextSink, ToolCall,
                            trim_at_stop)
from agent.llm.openai_stream import ServerLimits, StreamedReply, StreamLimits
from agent.tokens import TokenCounter, estimate_tokens
from agent.unicode import clean_json, clean_text

log = logging.getLogger(__name__)

# How each server takes a grammar (agent/grammar.py) in a chat-completions request body.
GRAMMAR_FIELDS: dict[str, Callable[[Grammar], dict[str, Any]]] = {
    "vllm": lambda grammar: {"structured_outputs": {"grammar": grammar.lark}},
    "sglang": lambda grammar: {"ebnf": grammar.for_llguidance_servers()},
    "llama.cpp": lambda grammar: {"grammar": grammar.for_llguidance_servers()},
}
# Statuses that mean "not this request", as a server answers a grammar it does not take.
GRAMMAR_REFUSALS = (400, 422)
POLL_SECONDS = 0.05  # how often a waiting call looks at its CancelToken
SERVER_WAIT_PAUSE_SECONDS = 5.0  # between tries at a server that refuses connections while it starts
FIRST_PROBE_SECONDS = 5.0  # the first start-up check's patience; each later one waits twice as long
BUSY_PAUSE_SECONDS = 1.0  # after a "busy" status (503, 429), the first pause before asking again; it doubles
MAX_MESSAGE_CHARS = 300  # a server's error text is cut to this, so our error stays one readable line
BUSY_STATUSES = (408, 429, 502, 503, 504)  # answers of a server that is up but cannot answer yet
VISION_SETTINGS = ("auto", "on", "off")
# Statuses that mean "not this request", as a server answers a picture its model cannot take.
IMAGE_REFUSALS = (400, 422)

T = TypeVar("T")


class OpenAILLM(LLM):
    """A chat-completions client speaking our `LLM` interface."""

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str = "EMPTY",
        limits: StreamLimits = StreamLimits(),
        startup_seconds: float = ServerLimits.startup_seconds,
        server_wait_seconds: float = ServerLimits.server_wait_seconds,
        max_retries: int = ServerLimits.max_retries,
        count_tokens: TokenCounter = estimate_tokens,
        grammar: str = "off",
        low_priority_concurrency: int = ServerLimits.low_priority_concurrency,
        vision: str = "auto",
    ) -> None:
        if grammar != "off" and grammar not in GRAMMAR_FIELDS:
            raise ValueError(f"unknown grammar style {grammar!r}")
        if vision not in VISION_SETTINGS:
            raise ValueError(f"unknown vision setting {vision!r}")
        self.base_url = base_url
        self.vision = vision  # "off" once the server has refused a picture in "auto"
        self.grammar_style = grammar  # "off" once the server has refused one
        self.model = model
        self.limits = limits
        self.startup_seconds = startup_seconds
        self.server_wait_seconds = server_wait_seconds  # how long a server that refuses connections may take to start
        self._api_key = api_key or "EMPTY"  # local servers ignore the key, but the client insists on one
        self._count = count_tokens
        # Background calls (Priority.LOW: summaries) go through their own narrow lane, so that however many are due
        # they take at most this many of the server's slots, and people's calls are never queued behind them here.
        self.low_priority_concurrency = low_priority_concurrency
        self._low_lane: asyncio.Semaphore | None = None
        # No read time-out of the client's own: the first-token and silence limits are timed here, per chunk,
        # because keep-alive pings would reset a socket-level read time-out while nothing is generated.
        self._client = AsyncOpenAI(base_url=base_url, api_key=self._api_key, max_retries=max_retries,
                                   timeout=httpx.Timeout(None, connect=limits.connect_seconds))

    @property
    def sees_images(self) -> bool:
        """Whether pictures are sent: OPENAI_VISION on, or auto until the server refused one."""
        return self.vision != "off"

    @property
    def url(self) -> str:
        """The server's address as it may be shown in messages and logs (no credentials)."""
        return _without_credentials(self.base_url)

    async def start(self) -> None:
        """Check the server answers `GET /models`, waiting for a busy one, and for one still starting (refusing
        connections) up to `server_wait_seconds`; a wrong address fails in one line."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.server_wait_seconds
        while True:
            try:
                return await self._wait_while_busy()
            except _Refused as refused:
                left = deadline - loop.time()
                if left <= 0:
                    raise refused.error from None
                log.warning("the model server at %s refuses connections (still starting?); trying again in %g s, "
                            "up to %.0f s more (OPENAI_SERVER_WAIT_SECONDS)", self.url,
                            min(SERVER_WAIT_PAUSE_SECONDS, left), left)
                await asyncio.sleep(min(SERVER_WAIT_PAUSE_SECONDS, left))

    async def _wait_while_busy(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_seconds
        patience, pause = FIRST_PROBE_SECONDS, BUSY_PAUSE_SECONDS
        while (busy := await self._probe(min(patience, max(deadline - loop.time(), 0.1)))) is not None:
            left = deadline - loop.time()
            if left <= 0:
                raise LLMError(f"the model server at {self.url} is running but busy: {busy.reason}, for "
                               f"{self.startup_seconds:g} s (OPENAI_STARTUP_SECONDS); try again when it is free")
            log.warning("the model server at %s is busy (%s); waiting for it, up to %.0f s more", self.url,
                        busy.reason, left)
            if busy.answered:  # it said so at once: pause before asking again (a time-out was the pause itself)
                await asyncio.sleep(min(pause, left))
            patience, pause = patience * 2, pause * 2

    async def _probe(self, patience: float) -> "_Busy | None":
        """One `GET /models`: None when the server answered, else why it looks busy. Raises `LLMError` when it is
        not running or refuses our key."""
        quick = self._client.with_options(
            timeout=httpx.Timeout(patience, connect=self.limits.connect_seconds), max_retries=0)
        try:
            page = await quick.models.list()
        except openai.APITimeoutError as error:
            if isinstance(error.__cause__, httpx.ConnectTimeout):
                raise LLMError(f"cannot reach the model server at {self.url}: no answer to the connection within "
                               f"{self.limits.connect_seconds:g} s (is the host up?)") from None
            return _Busy(f"no answer to GET /models within {patience:g} s", answered=False)
        except openai.APIConnectionError as error:
            failure = LLMError(f"cannot reach the model server at {self.url}: {self._reason(error)} "
                               f"(is it running?)")
            if _refused(error):
                raise _Refused(failure) from None
            raise failure from None
        except openai.APIStatusError as error:
            return self._status_at_start(error)
        self._check_model_listed([model.id for model in page.data])
        return None

    def _status_at_start(self, error: openai.APIStatusError) -> "_Busy | None":
        if error.status_code in (401, 403):
            raise LLMError(self._describe_status(error) + " (check OPENAI_API_KEY)") from None
        if error.status_code in BUSY_STATUSES:
            return _Busy(f"it answered {error.status_code} ({self._one_line(str(error.message))})", answered=True)
        # It answered, so it is reachable; some servers simply have no model list.
        log.warning("model server at %s has no usable model list: %s", self.url, self._describe_status(error))
        return None

    def _check_model_listed(self, served: list[str]) -> None:
        if served and self.model not in served:
            log.warning("model server at %s does not list %r (it lists %s)", self.url, self.model, ", ".join(served))

    async def served_models(self) -> list[str]:
        """The model ids the server lists (empty when it has no usable list), for `qwenbot doctor`; a server that
        is not running, does not answer or refuses our key is an `LLMError`."""
        quick = self._client.with_options(
            timeout=httpx.Timeout(self.limits.first_token_seconds, connect=self.limits.connect_seconds),
            max_retries=0)
        try:
            page = await quick.models.list()
        except openai.APIConnectionError as error:  # time-outs too
            raise LLMError(f"cannot reach the model server at {self.url}: {self._reason(error)}") from None
        except openai.APIStatusError as error:
            if error.status_code in (401, 403):
                raise LLMError(self._describe_status(error) + " (check OPENAI_API_KEY)") from None
            return []
        return [model.id for model in page.data]

    async def close(self) -> None:
        """Close the client's connections."""
        await self._client.close()

    def count_tokens(self, text: str) -> int:
        """Count tokens with Qwen's vocabulary (the model's own tokenizer lives on the server)."""
        return self._count(text)

    async def complete(self, request: ModelRequest) -> Completion:
        """One streamed chat completion; an assistant message last is continued (see `fold_assistant_prefix`).
        A LOW-priority request waits for a place in the background lane (OPENAI_LOW_PRIORITY_CONCURRENCY)."""
        if request.priority != Priority.LOW:
            return await self._complete(request)
        if self._low_lane is None:  # made here, on the loop that uses it
            self._low_lane = asyncio.Semaphore(self.low_priority_concurrency)
        async with self._low_lane:
            return await self._complete(request)

    async def _complete(self, request: ModelRequest) -> Completion:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": to_chat_messages(request.messages),
            "max_tokens": request.max_new_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},  # servers that do not know it ignore it (and count nothing)
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.tools:
            body["tools"] = list(request.tools)
        if request.grammar is not None and self.grammar_style != "off":
            body["extra_body"] = GRAMMAR_FIELDS[self.grammar_style](request.grammar)
        body = clean_json(body)  # a lone surrogate would fail the request body's UTF-8 encoding
        try:
            reply = await self._read_stream(body, request.cancel, request.on_text)
        except _GrammarRefused as refused:
            log.warning("%s; sending no grammar (OPENAI_GRAMMAR=%s) from now on", refused, self.grammar_style)
            self.grammar_style = "off"
            del body["extra_body"]
            reply = await self._read_stream(body, request.cancel, request.on_text)
        return self.counters.count(self._completion(reply, body["messages"], request.stop))

    def _images_refused(self, reason: str) -> ImagesRefused:
        if self.vision == "auto":
            log.warning("%s; the model reads text only: sending no picture (OPENAI_VISION=auto) from now on", reason)
            self.vision = "off"
        return ImagesRefused(f"{reason}: the model {self.model} reads text only (OPENAI_VISION={self.vision})")

    async def _read_stream(self, request: dict[str, Any], cancel: CancelToken | None,
                           on_text: TextSink | None) -> StreamedReply:
        """Open the stream and read it to its end under the time limits; the stream is closed however it ends."""
        loop = asyncio.get_running_loop()
        reply = StreamedReply()
        deadline = loop.time() + self.limits.first_token_seconds
        stream = None
        try:
            stream = await self._within(self._client.chat.completions.create(**request), deadline, cancel, reply)
            chunks = stream.__aiter__()
            while (chunk := await self._within(anext(chunks, None), deadline, cancel, reply)) is not None:
                text = reply.add(chunk)
                if reply.started:
                    deadline = loop.time() + self.limits.silence_seconds
                if text and on_text is not None:
                    on_text(text)
        except openai.APITimeoutError:
            raise LLMTimeout(f"cannot reach the model server at {self.url}: no connection within "
                             f"{self.limits.connect_seconds:g} s (OPENAI_CONNECT_TIMEOUT_SECONDS)") from None
        except openai.APIConnectionError as error:
            raise LLMError(f"cannot reach the model server at {self.url}: {self._reason(error)}") from None
        except openai.APIStatusError as error:
            if "extra_body" in request and error.status_code in GRAMMAR_REFUSALS:
                raise _GrammarRefused(f"{self._describe_status(error)} to a request with a grammar") from None
            if error.status_code in IMAGE_REFUSALS and carries_pictures(request["messages"]):
                raise self._images_refused(f"{self._describe_status(error)} to a request with a picture") from None
            raise LLMError(self._describe_status(error)) from None
        except openai.OpenAIError as error:
            raise LLMError(f"model server at {self.url} failed: {self._one_line(str(error))}") from None
        finally:
            if stream is not None:
                await stream.close()  # drops the connection: the server stops generating for nobody
        return reply

    async def _within(self, call: Awaitable[T], deadline: float, cancel: CancelToken | None,
                      reply: StreamedReply) -> T:
        """Await `call` until `deadline` or until `cancel` is set; a call left behind is cancelled."""
        task = asyncio.ensure_future(call)
        loop = asyncio.get_running_loop()
        try:
            while not task.done():
                if cancel is not None and cancel.cancelled:
                    raise LLMCancelled(f"request to the model server at {self.url} was cancelled")
                if (left := deadline - loop.time()) <= 0:
                    raise self._silence_error(reply)
                await asyncio.wait({task}, timeout=min(POLL_SECONDS, left))
            return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task})

    def _silence_error(self, reply: StreamedReply) -> LLMTimeout:
        if reply.started:
            return LLMTimeout(f"model server at {self.url} went silent mid-answer for "
                              f"{self.limits.silence_seconds:g} s (OPENAI_SILENCE_SECONDS)")
        return LLMTimeout(f"model server at {self.url} sent no answer within {self.limits.first_token_seconds:g} s "
                          f"(OPENAI_FIRST_TOKEN_SECONDS)")

    def _completion(self, reply: StreamedReply, sent: list[Message], stop: Sequence[str]) -> Completion:
        if reply.finish_reason is None:
            # llama.cpp's Python server ends a stream this way when a newer request interrupts it (its default).
            raise LLMError(f"model server at {self.url} ended the answer before it was finished (llama-cpp-python's "
                           "server does so when another request arrives: start it with --interrupt_requests False)")
        # Servers trim at `stop` themselves; trimming again covers those that ignore some stop strings.
        # A JSON `\\ud800` escape from the server decodes to a lone surrogate, which nothing downstream can encode.
        text, stopped = trim_at_stop(clean_text(reply.text), stop)
        usage = reply.usage
        return Completion(
            text=text,
            prompt_tokens=usage.prompt_tokens if usage else sum(self._count(text_of(m.get("content"))) for m in sent),
            completion_tokens=usage.completion_tokens if usage else self._count(text),
            finish_reason="length" if reply.finish_reason == "length" and not stopped else "stop",
            tool_calls=tuple(ToolCall(name=clean_text(name), arguments=clean_text(arguments), id=call_id)
                             for call_id, name, arguments in reply.calls()),
        )

    def _describe_status(self, error: openai.APIStatusError) -> str:
        body = error.body
        message = str((body.get("message") if isinstance(body, dict) else body) or error.message)
        return f"model server at {self.url} answered {error.status_code}: {self._one_line(message)}"

    def _reason(self, error: openai.APIConnectionError) -> str:
        # The client's own text is a bare "Connection error."; the cause (refused, no such host) says more.
        cause = error.__cause__
        if cause is None:
            return self._one_line(error.message)
        return self._one_line(str(cause) or type(cause).__name__)

    def _one_line(self, text: str) -> str:
        """Collapse whitespace, cut to a readable length, and never repeat the API key a server echoed back."""
        if self._api_key != "EMPTY":
            text = text.replace(self._api_key, "***")
        text = re.sub(r"\s+", " ", text).strip()
        return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


@dataclass(frozen=True)
class _Busy:
    """Why the server looks busy at start-up, and whether it said so (a status) or kept silent (a time-out)."""

    reason: str
    answered: bool


class _GrammarRefused(LLMError):
    """The server answered a request that carried a grammar with a refusal (it does not take that grammar)."""


def to_chat_messages(messages: Sequence[Message]) -> list[Message]:
    """Our messages as the chat-completions API takes them: prefix folded, tool calls with ids and JSON arguments."""
    return _with_tool_call_ids(fold_assistant_prefix(messages))


def fold_assistant_prefix(messages: Sequence[Message]) -> list[Message]:
    """Fold a trailing assistant prefix into the user message before it, so the server's reply continues it.

    Our contract is that a last message from the assistant is *continued* (that is how a ReAct trace grows within
    one turn). Chat-completions servers generally cannot continue an assistant prefix: they would open a new
    assistant turn after it. As Qwen-Agent does (`simulate_response_completion_with_chat`), the prefix goes at the
    end of the preceding user message instead, as `<user content>\\n<assistant prefix>`, and no assistant message is
    sent; the model then writes the continuation as its answer. We join with one newline rather than Qwen-Agent's
    two because the ReAct prompt ends with `Question: ...` and the trace's `Thought:` belongs on the next line.
    An assistant message carrying tool calls is a finished turn (native mode), not a prefix, and is left alone.
    """
    folded = [dict(message) for message in messages]
    if not folded or folded[-1].get("role") != "assistant" or folded[-1].get("tool_calls"):
        return folded
    prefix = str(folded.pop().get("content") or "")
    if not prefix:
        return folded  # nothing to continue: an empty prefix is just a new assistant turn
    if folded and folded[-1].get("role") == "user":
        folded[-1]["content"] = _continued(folded[-1].get("content"), prefix)
    else:
        folded.append({"role": "user", "content": prefix})  # no question to attach it to: send it on its own
    return folded


def _continued(content: Any, prefix: str) -> Any:
    """A user message's content with the assistant prefix after its text: in its last text part when the content
    is a list of parts (a question with a picture)."""
    if not isinstance(content, list):
        return f"{content or ''}\n{prefix}"
    parts = [dict(part) for part in content]
    texts = [index for index, part in enumerate(parts) if part.get("type") == "text"]
    if not texts:
        return [*parts, {"type": "text", "text": prefix}]
    last = parts[texts[-1]]
    last["text"] = f"{last.get('text') or ''}\n{prefix}"
    return parts


def carries_pictures(messages: Sequence[Message]) -> bool:
    """Whether any message holds a picture part."""
    return any(isinstance(message.get("content"), list) and
               any(isinstance(part, dict) and part.get("type") == "image_url" for part in message["content"])
               for message in messages)


def _with_tool_call_ids(messages: list[Message]) -> list[Message]:
    """Give every tool call an id and JSON-text arguments, and every tool result the id of the call it answers."""
    pending: deque[str] = deque()  # ids of the latest calls not yet answered, in order
    converted = []
    for position, message in enumerate(messages):
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = [_api_tool_call(call, f"call_{position}_{n}") for n, call in enumerate(message["tool_calls"])]
            pending = deque(call["id"] for call in calls)
            converted.append({"role": "assistant", "content": message.get("content") or "", "tool_calls": calls})
        elif role == "tool":
            call_id = message.get("tool_call_id") or (pending[0] if pending else f"call_{position}")
            if call_id in pending:
                pending.remove(call_id)
            converted.append({"role": "tool", "tool_call_id": call_id, "content": _as_text(message.get("content"))})
        else:
            # Only the fields the API defines: a strict server refuses a message with extra keys.
            kept = {key: message[key] for key in ("role", "name") if key in message}
            converted.append({**kept, "content": _as_text(message.get("content"))})
    return converted


def _api_tool_call(call: dict[str, Any], fallback_id: str) -> dict[str, Any]:
    """One tool call in the API's shape; arguments become JSON text, as the API requires."""
    function = call.get("function") or call  # tolerate the flat {"name", "arguments"} shape too
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    return {"id": call.get("id") or fallback_id, "type": "function",
            "function": {"name": function["name"], "arguments": arguments}}


def _as_text(content: Any) -> Any:
    """Message content as the API takes it: text (or a list of content parts, passed through)."""
    if content is None:
        return ""
    if isinstance(content, (str, list)):
        return content
    return json.dumps(content, ensure_ascii=False)


def _without_credentials(url: str) -> str:
    """`url` without any `user:password@` part, fit to show in messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


class _Refused(Exception):
    """The server refused the connection: nothing listens there (yet)."""

    def __init__(self, error: LLMError):
        super().__init__(str(error))
        self.error = error


def _refused(error: BaseException) -> bool:
    """Whether a connection error was the other end refusing (nothing listening), not a name or route failure."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
