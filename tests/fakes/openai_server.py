"""A small OpenAI-compatible HTTP server on 127.0.0.1 for tests: real sockets, scripted answers.

    with FakeOpenAIServer() as server:
        server.add(error(500), text("Thought: ...Observation: ignored"), HANG)
        llm = OpenAILLM(base_url=server.base_url, model="fake-qwen")
        ...
        assert server.chat_requests[0].body["stop"] == ["Observation:"]

It serves `GET /v1/models`, `POST /v1/chat/completions` and `POST /v1/audio/transcriptions` (a multipart form, as
the OpenAI API takes it: `transcriptions` records each one's fields and file; `add_transcription` scripts the
answers, `{"text": ...}` or an error, a delay or a hang, from the same `Reply`s). Each chat request takes the next
scripted `Reply`: a
text answer (trimmed at the request's first `stop` string, as real servers do), tool calls, an error status (with
headers such as Retry-After), a dropped connection, or a hang that never answers. Every request is recorded, with
the time it arrived, and the server counts how many chat requests it was handling at once (`max_in_flight`), so
tests can check concurrency by what the server saw rather than by timing alone.

A request with `"stream": true` is answered as real servers stream: server-sent events over chunked HTTP, a role
chunk, the text in small pieces (`pieces`, `chunk_delay` apart), a finish chunk, a usage chunk when
`stream_options.include_usage` asks for one, then `data: [DONE]`. A reply can go silent after some pieces
(`silent_after`), or end without a finish reason (`unfinished`, as llama.cpp's Python server does when a newer
request interrupts one). Each stream is logged (`streams`): when each piece left, and whether the client closed
the connection before the end, which the server notices as real ones do, by the socket closing under it.

The stdlib `ThreadingHTTPServer` runs in a background thread, one thread per connection: blocking and simple, and
enough for a handful of concurrent requests.
"""

from __future__ import annotations

import json
import select
from email.parser import BytesParser
from email.policy import HTTP
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
TRANSCRIPTIONS_PATH = "/v1/audio/transcriptions"


@dataclass(frozen=True)
class Reply:
    """One scripted answer to a chat request."""

    status: int = 200
    text: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    hang: bool = False
    drop: bool = False
    finish_reason: str | None = None
    pieces: tuple[str, ...] = ()  # how a streamed answer is cut (default: a few characters each)
    chunk_delay: float = 0.0  # seconds between streamed pieces
    silent_after: int | None = None  # stream this many pieces, then send nothing more (until the client leaves)
    unfinished: bool = False  # end the stream with [DONE] but no finish reason


@dataclass
class StreamLog:
    """One streamed answer as the server sent it."""

    sent_at: list[float] = field(default_factory=list)  # time.monotonic() of each text piece
    closed_by_client: bool = False  # the client hung up before the stream's end
    finished: bool = False  # the server sent [DONE]


HANG = Reply(hang=True)  # never answer
DROP = Reply(drop=True)  # close the connection without answering, as a crashing server does


def text(content: str, *, delay: float = 0.0, finish_reason: str | None = None, pieces: int | None = None,
         chunk_delay: float = 0.0, silent_after: int | None = None, unfinished: bool = False) -> Reply:
    """A plain text answer, as the model would write it (the server trims it at the request's stop strings);
    streamed in `pieces` pieces when given."""
    return Reply(text=content, delay=delay, finish_reason=finish_reason, pieces=_cut(content, pieces),
                 chunk_delay=chunk_delay, silent_after=silent_after, unfinished=unfinished)


def _cut(content: str, pieces: int | None) -> tuple[str, ...]:
    if not pieces:
        return ()
    size = max(1, -(-len(content) // pieces))
    return tuple(content[i:i + size] for i in range(0, len(content), size))


def tool_call(name: str, arguments: dict[str, Any] | str, *, call_id: str = "call_1", content: str = "") -> Reply:
    """An answer carrying one native tool call, arguments as the JSON text servers send."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}
    return Reply(text=content, tool_calls=(call,))


def error(status: int, message: str = "", *, retry_after: float | None = None) -> Reply:
    """An error status with an OpenAI-shaped body; `retry_after` sets the Retry-After header (seconds)."""
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
    return Reply(status=status, text=message or f"fake error {status}", headers=headers)


@dataclass(frozen=True)
class Upload:
    """A transcription request's form: its plain fields, and the uploaded file."""

    fields: dict[str, str]
    file_name: str
    content_type: str
    file: bytes


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    received_at: float  # time.monotonic()


class FakeOpenAIServer:
    """An OpenAI-compatible server on a free port of 127.0.0.1, answering from a queue of `Reply`s."""

    def __init__(self, model: str = "fake-qwen", port: int = 0) -> None:
        self.model = model
        self.requests: list[RecordedRequest] = []
        self.max_in_flight = 0
        self.streams: list[StreamLog] = []
        # Until this time.monotonic(), GET /v1/models waits: llama.cpp's Python server answers it only once the
        # generation in progress is over (see `busy_for`).
        self.busy_until = 0.0
        # Statuses GET /v1/models answers first, one per request (503: a server still loading its model).
        self.models_statuses: list[int] = []
        self._replies: list[Reply] = []
        self._transcription_replies: list[Reply] = []
        self._in_flight = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = _Server(("127.0.0.1", port), _Handler)  # port 0: a free one
        self._httpd.daemon_threads = True
        self._httpd.fake = self  # type: ignore[attr-defined]
        # A short poll interval makes stop() quick: shutdown() waits for serve_forever's next poll.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-openai", daemon=True
        )

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """What OPENAI_BASE_URL should be to reach this server."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """Only the chat-completion requests, in arrival order."""
        return [r for r in self.requests if r.path == CHAT_PATH]

    @property
    def transcriptions(self) -> list[Upload]:
        """The transcription requests' forms, in arrival order."""
        return [r.body for r in self.requests if r.path == TRANSCRIPTIONS_PATH]

    def add_transcription(self, *replies: Reply | str) -> None:
        """Queue answers for the next transcription requests; a plain string is the transcript."""
        with self._lock:
            self._transcription_replies.extend(Reply(text=r) if isinstance(r, str) else r for r in replies)

    def busy_for(self, seconds: float) -> None:
        """Be busy generating for someone else for `seconds`: GET /v1/models waits until then."""
        self.busy_until = time.monotonic() + seconds

    def add(self, *replies: Reply | str) -> None:
        """Queue answers for the next chat requests; a plain string is a text answer."""
        with self._lock:
            self._replies.extend(text(r) if isinstance(r, str) else r for r in replies)

    def start(self) -> "FakeOpenAIServer":
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release hanging requests and stop serving."""
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def _next_reply(self, transcription: bool = False) -> Reply:
        with self._lock:
            queue = self._transcription_replies if transcription else self._replies
            if queue:
                return queue.pop(0)
        # x-should-retry: false keeps the client from retrying, so a test missing a reply fails at once.
        return Reply(status=500, text="fake server: no scripted reply left", headers={"x-should-retry": "false"})

    def _enter_request(self) -> None:
        with self._lock:
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)

    def _leave_request(self) -> None:
        with self._lock:
            self._in_flight -= 1


class _Server(ThreadingHTTPServer):
    # The stdlib's listen backlog of 5 drops simultaneous connections beyond it, and a dropped SYN is retried
    # only after a second: tests that open many connections at once need room for them all.
    request_queue_size = 128


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the openai client expects from real servers
    # Headers and body are written separately: without this a kept-alive call waits ~40 ms for a delayed ACK.
    disable_nagle_algorithm = True

    @property
    def fake(self) -> FakeOpenAIServer:
        return self.server.fake  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        """Stay quiet: tests assert on recorded requests, not on logs."""

    def do_GET(self) -> None:
        """GET /v1/models lists the one model this server pretends to serve."""
        self._record(body=None)
        if self.path != MODELS_PATH:
            return self._send_json(404, _error_body(404, f"no route {self.path}"))
        busy = self.fake.busy_until - time.monotonic()
        if busy > 0 and self._wait_for_client_or_stop(busy):
            self.close_connection = True
            return
        with self.fake._lock:
            status = self.fake.models_statuses.pop(0) if self.fake.models_statuses else 200
        if status != 200:
            return self._send_json(status, _error_body(status, "Loading model"))
        model = {"id": self.fake.model, "object": "model", "created": 0, "owned_by": "fake"}
        self._send_json(200, {"object": "list", "data": [model]})

    def do_POST(self) -> None:
        """POST /v1/chat/completions answers with the next scripted reply; /v1/audio/transcriptions too."""
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == TRANSCRIPTIONS_PATH:
            return self._transcribe(raw)
        body = json.loads(raw or b"null")
        self._record(body=body)
        if self.path != CHAT_PATH:
            return self._send_json(404, _error_body(404, f"no route {self.path}"))
        self.fake._enter_request()
        try:
            self._answer(self.fake._next_reply(), body)
        finally:
            self.fake._leave_request()

    def _transcribe(self, raw: bytes) -> None:
        """Read the multipart form as a server does, record it, and answer with the next scripted transcript."""
        upload = _parse_form(self.headers.get("Content-Type", ""), raw)
        self._record(body=upload)
        if upload is None:
            return self._send_json(400, _error_body(400, "expected a multipart form with a file"))
        reply = self.fake._next_reply(transcription=True)
        if reply.hang:
            self._wait_for_client_or_stop(None)
            self.close_connection = True
            return
        if reply.delay and self.fake._stopping.wait(reply.delay):
            return
        if reply.status != 200:
            return self._send_json(reply.status, _error_body(reply.status, reply.text), reply.headers)
        self._send_json(200, {"text": reply.text}, reply.headers)

    def _answer(self, reply: Reply, request: dict[str, Any]) -> None:
        if reply.hang:
            self._wait_for_client_or_stop(None)  # never answer; the server's stop() lets the thread go
            self.close_connection = True
            return
        if reply.drop:
            self.close_connection = True
            return
        if reply.delay and self.fake._stopping.wait(reply.delay):
            return
        if reply.status != 200:
            return self._send_json(reply.status, _error_body(reply.status, reply.text), reply.headers)
        if request.get("stream"):
            return self._stream(reply, request)
        self._send_json(200, _completion_body(reply, request), reply.headers)

    def _stream(self, reply: Reply, request: dict[str, Any]) -> None:
        """Server-sent events over chunked HTTP, as vLLM and llama.cpp send them."""
        log = StreamLog()
        with self.fake._lock:
            self.fake.streams.append(log)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            self._stream_events(reply, request, log)
        except (BrokenPipeError, ConnectionResetError):
            log.closed_by_client = True
        if log.closed_by_client:
            self.close_connection = True

    def _stream_events(self, reply: Reply, request: dict[str, Any], log: StreamLog) -> None:
        content, stopped = _trim_at_stop(reply.text, request.get("stop"))
        base = {"id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": request.get("model", "")}
        self._event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                          "finish_reason": None}]})
        pieces = _pieces_of(content, reply.pieces) if content else []
        for number, piece in enumerate(pieces):
            if number == reply.silent_after:
                log.closed_by_client = self._wait_for_client_or_stop(None)  # silent until the client gives up
                return
            if number and self._wait_for_client_or_stop(reply.chunk_delay):
                log.closed_by_client = True
                return
            self._event({**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
            log.sent_at.append(time.monotonic())
        for number, call in enumerate(reply.tool_calls):
            self._event({**base, "choices": [{"index": 0, "delta": {"tool_calls": _call_deltas(call, number)},
                                              "finish_reason": None}]})
        if not reply.unfinished:
            finish = "stop" if stopped else reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
            self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        if (request.get("stream_options") or {}).get("include_usage"):
            self._event({**base, "choices": [], "usage": _usage(request, content)})
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")
        log.finished = True

    def _wait_for_client_or_stop(self, seconds: float | None) -> bool:
        """Wait `seconds` (None: until the server stops); True as soon as the client closes the connection."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not self.fake._stopping.is_set():
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                return False
            readable, _, _ = select.select([self.connection], [], [], left)
            if readable and _closed(self.connection):
                return True
        return False

    def _event(self, payload: dict[str, Any]) -> None:
        self._write_chunk(b"data: " + json_bytes(payload) + b"\n\n")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):X}\r\n".encode("ascii") + data + b"\r\n")
        self.wfile.flush()

    def _record(self, body: Any) -> None:
        headers = {name.lower(): value for name, value in self.headers.items()}
        self.fake._record(RecordedRequest(self.command, self.path, headers, body, time.monotonic()))

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        data = json_bytes(payload)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def json_bytes(payload: Any) -> bytes:
    """JSON as UTF-8; a string holding a lone surrogate goes out as a `\\ud800` escape, as JSON allows (UTF-8
    has no byte form for it)."""
    try:
        return json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(payload).encode("ascii")


def _parse_form(content_type: str, raw: bytes) -> Upload | None:
    """A multipart/form-data body: its text fields and its one file (None when it has no file)."""
    if not content_type.startswith("multipart/form-data"):
        return None
    message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + raw)
    fields: dict[str, str] = {}
    upload = None
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        file_name = part.get_param("filename", header="content-disposition")
        data = part.get_payload(decode=True) or b""
        if file_name is None:
            fields[str(name)] = data.decode("utf-8")
        else:
            upload = (str(file_name), part.get_content_type(), data)
    if upload is None:
        return None
    return Upload(fields, *upload)


def _error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error" if status >= 500 else "invalid_request_error",
                      "code": status}}


def _closed(connection: socket.socket) -> bool:
    """Whether the peer closed a connection that select() says is readable (it sends nothing else meanwhile)."""
    try:
        return connection.recv(1, socket.MSG_PEEK) == b""
    except (ConnectionResetError, OSError):
        return True


def _pieces_of(content: str, pieces: tuple[str, ...]) -> list[str]:
    """The scripted pieces of `content` (cut to what is left after the stop string), or 4 characters each."""
    if not pieces:
        return [content[i:i + 4] for i in range(0, len(content), 4)]
    out, left = [], content
    for piece in pieces:
        if not left:
            break
        out.append(left[:len(piece)])
        left = left[len(piece):]
    return out + ([left] if left else [])


def _call_deltas(call: dict[str, Any], index: int) -> list[dict[str, Any]]:
    return [{"index": index, "id": call["id"], "type": "function",
             "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}]


def _usage(request: dict[str, Any], content: str) -> dict[str, int]:
    # Usage counts characters, not tokens: enough for tests to see the server's numbers pass through.
    prompt_chars = sum(len(str(m.get("content") or "")) for m in request.get("messages", []))
    return {"prompt_tokens": prompt_chars, "completion_tokens": len(content),
            "total_tokens": prompt_chars + len(content)}


def _completion_body(reply: Reply, request: dict[str, Any]) -> dict[str, Any]:
    content, stopped = _trim_at_stop(reply.text, request.get("stop"))
    finish_reason = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reply.tool_calls:
        message["tool_calls"] = list(reply.tool_calls)
    # Usage counts characters, not tokens: enough for tests to see the server's numbers pass through.
    prompt_chars = sum(len(str(m.get("content") or "")) for m in request.get("messages", []))
    return {
        "id": f"chatcmpl-{time.monotonic_ns()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", ""),
        "choices": [{"index": 0, "message": message, "finish_reason": "stop" if stopped else finish_reason}],
        "usage": {"prompt_tokens": prompt_chars, "completion_tokens": len(content),
                  "total_tokens": prompt_chars + len(content)},
    }


def _trim_at_stop(content: str, stop: str | list[str] | None) -> tuple[str, bool]:
    """Cut before the earliest stop string, as vLLM and OpenAI do (the stop string is not returned).

    Written here rather than imported from `agent.llm.base`: the fake must not share code with what it tests.
    """
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    cuts = [index for s in stops if s and (index := content.find(s)) >= 0]
    return (content[: min(cuts)], True) if cuts else (content, False)
