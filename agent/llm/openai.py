"""The OpenAI-compatible backend: any chat-completions server (vLLM, SGLang, llama.cpp, Ollama, OpenAI itself).

Concurrency is the server's job: each call is one HTTP request on the official `openai` client's connection pool,
so many chats can be in flight at once and a vLLM deployment batches them across its GPUs.

Retries are the client's own (`max_retries`): exponential backoff from 0.5 s (capped at 8 s) on 408, 409, 429,
5xx and dropped connections, honouring the server's Retry-After (up to two minutes). On top of that, every call
has one deadline, `timeout_seconds`, retries included: the user waits for an answer, not for an attempt, and a
server that never answers gives `LLMTimeout` after that long rather than after every retry has timed out too.

With `grammar` (OPENAI_GRAMMAR) each step's grammar goes with the request, in the field the server takes: vLLM's
structured outputs, SGLang's `ebnf`, llama.cpp's `grammar` (the latter two in llguidance's Lark, which they accept
when served with llguidance). A server that refuses it (400 or 422 with a grammar attached) gets the same request
again without one, and no grammar after that: the bot keeps answering, unconstrained, and says so once in the log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections import deque
from typing import Any, Awaitable, Callable, Sequence, TypeVar
from urllib.parse import urlsplit, urlunsplit

import openai
from openai import AsyncOpenAI

from agent.errors import LLMCancelled, LLMError, LLMTimeout
from agent.grammar import Grammar
from agent.llm.base import LLM, CancelToken, Completion, Message, ToolCall, trim_at_stop
from agent.tokens import TokenCounter, estimate_tokens

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
START_TIMEOUT_SECONDS = 5.0  # the reachability check at start-up should fail fast, not after a generation's time-out
MAX_MESSAGE_CHARS = 300  # a server's error text is cut to this, so our error stays one readable line

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
        timeout_seconds: float = 60.0,
        max_retries: int = 3,
        count_tokens: TokenCounter = estimate_tokens,
        grammar: str = "off",
    ) -> None:
        if grammar != "off" and grammar not in GRAMMAR_FIELDS:
            raise ValueError(f"unknown grammar style {grammar!r}")
        self.base_url = base_url
        self.grammar_style = grammar  # "off" once the server has refused one
        self.model = model
        self.timeout_seconds = timeout_seconds
        self._api_key = api_key or "EMPTY"  # local servers ignore the key, but the client insists on one
        self._count = count_tokens
        self._client = AsyncOpenAI(
            base_url=base_url, api_key=self._api_key, timeout=timeout_seconds, max_retries=max_retries
        )

    @property
    def url(self) -> str:
        """The server's address as it may be shown in messages and logs (no credentials)."""
        return _without_credentials(self.base_url)

    async def start(self) -> None:
        """Check the server answers `GET /models`, so a wrong address fails start-up in one clear line."""
        quick = self._client.with_options(timeout=min(START_TIMEOUT_SECONDS, self.timeout_seconds), max_retries=0)
        try:
            page = await quick.models.list()
        except openai.APIConnectionError as error:
            raise LLMError(f"cannot reach the model server at {self.url}: {self._reason(error)}") from None
        except openai.APIStatusError as error:
            if error.status_code in (401, 403):
                raise LLMError(self._describe_status(error) + " (check OPENAI_API_KEY)") from None
            # It answered, so it is reachable; some servers simply have no model list.
            log.warning("model server at %s has no usable model list: %s", self.url, self._describe_status(error))
            return
        served = [model.id for model in page.data]
        if served and self.model not in served:
            log.warning("model server at %s does not list %r (it lists %s)", self.url, self.model, ", ".join(served))

    async def close(self) -> None:
        """Close the client's connections."""
        await self._client.close()

    def count_tokens(self, text: str) -> int:
        """Count tokens with Qwen's vocabulary (the model's own tokenizer lives on the server)."""
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
        """One chat completion; an assistant message last is continued (see `fold_assistant_prefix`)."""
        request: dict[str, Any] = {
            "model": self.model,
            "messages": to_chat_messages(messages),
            "max_tokens": max_new_tokens,
        }
        if stop:
            request["stop"] = list(stop)
        if tools:
            request["tools"] = list(tools)
        if grammar is not None and self.grammar_style != "off":
            request["extra_body"] = GRAMMAR_FIELDS[self.grammar_style](grammar)
        try:
            response = await self._answer_within_deadline(self._client.chat.completions.create(**request), cancel,
                                                           with_grammar="extra_body" in request)
        except _GrammarRefused as refused:
            log.warning("%s; sending no grammar (OPENAI_GRAMMAR=%s) from now on", refused, self.grammar_style)
            self.grammar_style = "off"
            del request["extra_body"]
            response = await self._answer_within_deadline(self._client.chat.completions.create(**request), cancel)
        return self._completion(response, request["messages"], stop)

    async def _answer_within_deadline(self, call: Awaitable[T], cancel: CancelToken | None,
                                      with_grammar: bool = False) -> T:
        """Await `call`, giving up at the deadline or when `cancel` is set, with our errors for the client's."""
        task = asyncio.ensure_future(call)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_seconds
        try:
            while not task.done():
                if cancel is not None and cancel.cancelled:
                    raise LLMCancelled(f"request to the model server at {self.url} was cancelled")
                if (left := deadline - loop.time()) <= 0:
                    raise self._timeout_error()
                await asyncio.wait({task}, timeout=min(POLL_SECONDS, left))
            return task.result()
        except openai.APITimeoutError:
            raise self._timeout_error() from None
        except openai.APIConnectionError as error:
            raise LLMError(f"cannot reach the model server at {self.url}: {self._reason(error)}") from None
        except openai.APIStatusError as error:
            if with_grammar and error.status_code in GRAMMAR_REFUSALS:
                raise _GrammarRefused(f"{self._describe_status(error)} to a request with a grammar") from None
            raise LLMError(self._describe_status(error)) from None
        except openai.OpenAIError as error:
            raise LLMError(f"model server at {self.url} failed: {self._one_line(str(error))}") from None
        finally:
            if not task.done():
                task.cancel()  # closes the HTTP request, so the server can stop generating for nobody
                await asyncio.wait({task})

    def _completion(self, response: Any, sent: list[Message], stop: Sequence[str]) -> Completion:
        if not getattr(response, "choices", None):  # an empty list, or not a chat completion at all
            raise LLMError(f"model server at {self.url} returned no choices")
        choice = response.choices[0]
        # Servers trim at `stop` themselves; trimming again covers those that ignore some stop strings.
        text, stopped = trim_at_stop(choice.message.content or "", stop)
        usage = response.usage
        return Completion(
            text=text,
            prompt_tokens=usage.prompt_tokens if usage else sum(self._count(str(m.get("content") or "")) for m in sent),
            completion_tokens=usage.completion_tokens if usage else self._count(text),
            finish_reason="length" if choice.finish_reason == "length" and not stopped else "stop",
            tool_calls=_tool_calls(choice.message),
        )

    def _timeout_error(self) -> LLMTimeout:
        return LLMTimeout(f"model server at {self.url} did not answer within {self.timeout_seconds:g} s")

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
        folded[-1]["content"] = f"{folded[-1].get('content') or ''}\n{prefix}"
    else:
        folded.append({"role": "user", "content": prefix})  # no question to attach it to: send it on its own
    return folded


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


def _tool_calls(message: Any) -> tuple[ToolCall, ...]:
    """The function calls the server parsed from the model's output, arguments kept as raw JSON text."""
    calls = []
    for call in message.tool_calls or ():
        function = getattr(call, "function", None)  # custom (non-function) tool calls have none
        if function is not None:
            calls.append(ToolCall(name=function.name, arguments=function.arguments or "{}", id=call.id or ""))
    return tuple(calls)


def _without_credentials(url: str) -> str:
    """`url` without any `user:password@` part, fit to show in messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
