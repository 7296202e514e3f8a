"""A fake Telegram Bot API server on 127.0.0.1 for tests: real HTTP, scripted users, recorded calls.

    with FakeTelegramServer() as server:
        alice = User(1001, "Alice")
        server.send_text(private_chat(alice), alice, "你好")        # queue an update for getUpdates
        ... run the bot with TELEGRAM_BASE_URL=server.base_url, TELEGRAM_BOT_TOKEN=server.token ...
        await server.wait_for(lambda: server.sent_texts(alice.id))
        assert "200" in server.sent_texts(alice.id)[0]

It serves what the bot calls: getMe, getUpdates (long polling with `timeout`; an update stays queued until a later
call's `offset` confirms it, as Telegram does), sendMessage, sendMessageDraft (private chats only, as Telegram;
`FakeTelegramServer(drafts=False)` answers it "Not Found", as Bot API servers before 9.3 do), editMessageText,
deleteMessage, sendChatAction, setMyCommands, deleteWebhook, setWebhook and getWebhookInfo; and files as the real Bot
API serves them: `send_document`, `send_voice` and `send_photo` queue a message with a user's file, `getFile`
answers its `file_path` (refusing a file over 20 MB, "file is too big", as Telegram does for bots) and
GET /file/bot<token>/<file_path> downloads it (`files_fetched` records the downloads). The bot's own sendDocument is
taken as a multipart upload (refused past Telegram's 50 MB for a bot's document and 1024-character captions), stored
the same way, and listed by `documents()`. Like the real server it refuses texts over 4096
characters, empty texts, HTML it cannot parse, and edits that change nothing. `fail(...)` scripts failures per
method: error statuses, 429 with `retry_after`, slow answers and dropped connections, before the call takes
effect or after it (a lost answer), for a number of calls or for a few seconds (an outage). Every call is recorded.
`restarted()` stops the server and starts a new one at the same address that remembers nothing but Telegram's
message ids, its update ids starting at 1 again, as a Bot API server restarted without its state.

The stdlib `ThreadingHTTPServer` runs in a background thread, one thread per connection: the long poll blocks
its own thread only. Tests on the event loop wait with `await server.wait_for(predicate)`.
"""

from __future__ import annotations

import asyncio
import email.parser
import email.policy
import itertools
import json
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qsl, unquote

from tests.fakes.openai_server import json_bytes

TOKEN = "123456:TEST-token-for-the-fake-server"
MAX_TEXT = 4096
MAX_CAPTION = 1024
MAX_UPLOAD_BYTES = 50 * 1000 * 1000  # what a bot may send as a document
MAX_DOWNLOAD = 20 * 1024 * 1024  # getFile refuses bigger files: bots download at most 20 MB
# Form fields PTB sends JSON-encoded; everything else (text, parse_mode, action...) is a plain string.
JSON_FIELDS = {
    "chat_id", "message_id", "reply_parameters", "commands", "scope", "timeout", "offset", "limit",
    "allowed_updates", "message_thread_id", "disable_notification", "link_preview_options", "entities",
    "drop_pending_updates", "max_connections", "protect_content", "reply_markup", "revoke", "draft_id",
}
HTML_TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "a", "code", "pre", "tg-spoiler",
             "span", "blockquote", "tg-emoji"}


@dataclass(frozen=True)
class User:
    """A Telegram user as the fake sends it in updates."""

    id: int
    first_name: str
    language_code: str = "en"
    username: str | None = None
    is_bot: bool = False

    def as_dict(self) -> dict[str, Any]:
        data = {"id": self.id, "is_bot": self.is_bot, "first_name": self.first_name,
                "language_code": self.language_code}
        if self.username:
            data["username"] = self.username
        return data


@dataclass(frozen=True)
class Chat:
    """A chat: private (id = the user's id), group or supergroup (negative ids), maybe with forum topics."""

    id: int
    type: str = "private"
    title: str = ""
    is_forum: bool = False
    first_name: str = ""  # private chats carry the user's name

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"id": self.id, "type": self.type}
        if self.title:
            data["title"] = self.title
        if self.first_name:
            data["first_name"] = self.first_name
        if self.is_forum:
            data["is_forum"] = True
        return data


def private_chat(user: User) -> Chat:
    """The private chat between `user` and the bot."""
    return Chat(user.id, "private", first_name=user.first_name)


def group_chat(chat_id: int = -1001234567890, title: str = "Team", *, forum: bool = False) -> Chat:
    """A supergroup (optionally a forum with topics)."""
    return Chat(chat_id, "supergroup", title, forum)


@dataclass(frozen=True)
class ApiCall:
    """One request as the server received it, and how it answered."""

    method: str
    params: dict[str, Any]
    status: int
    at: float  # time.monotonic()
    result: Any = None

    @property
    def ok(self) -> bool:
        """Whether the server answered 200."""
        return self.status == 200


@dataclass
class Failure:
    """A scripted failure of `method`: the next `times` matching calls get it."""

    method: str
    status: int = 500
    description: str = "Internal Server Error"
    retry_after: float | None = None
    times: int = 1
    when: Callable[[dict[str, Any]], bool] | None = None
    delay: float = 0.0  # answer this late (with the failure, or normally when status is 200)
    drop: bool = False  # close the connection without answering
    # The call takes effect first (a message is sent), then the answer is late or dropped: a lost *answer*, not a
    # lost request, which is what a client's read time-out looks like from the server's side.
    applied: bool = False
    until: float | None = None  # time.monotonic() after which the failure stops (an outage of a few seconds)

    def stop(self) -> None:
        """End this failure now (the outage is over)."""
        self.times = 0

    def active(self, method: str, params: dict[str, Any]) -> bool:
        """Whether this failure applies to a call of `method` with `params` now."""
        if self.method != method or self.times == 0 or (self.until is not None and time.monotonic() >= self.until):
            return False
        return self.when is None or self.when(params)


@dataclass(frozen=True)
class SentDocument:
    """A document the bot sent: where, its file's name and bytes, and its caption."""

    chat_id: int
    file_id: str
    file_name: str
    data: bytes
    caption: str


@dataclass
class _State:
    updates: list[dict[str, Any]] = field(default_factory=list)  # not yet confirmed by an offset
    pushed: dict[int, dict[str, Any]] = field(default_factory=dict)  # every update ever queued, by id
    messages: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    next_message_id: dict[int, int] = field(default_factory=dict)
    webhook_url: str = ""
    files: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # file_id → (file_path, content)
    sent_documents: list[SentDocument] = field(default_factory=list)  # what the bot sent, in order


class FakeTelegramServer:
    """A Bot API server on a free port of 127.0.0.1, holding one bot."""

    def __init__(self, *, token: str = TOKEN, bot_id: int = 777000, bot_username: str = "qwen_test_bot",
                 drafts: bool = True, host: str = "127.0.0.1", port: int = 0) -> None:
        self.token = token
        self.drafts = drafts
        self.bot = User(bot_id, "Qwen Test Bot", username=bot_username, is_bot=True)
        self.calls: list[ApiCall] = []
        self.polls_started = 0  # getUpdates calls received (a call is recorded only when it answers)
        self.files_fetched: list[str] = []  # file paths downloaded from /file/bot<token>/, in order
        self.failures: list[Failure] = []
        self._state = _State()
        self._update_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()  # open client connections, closed by `stop`
        self._httpd = _Server((host, port), _Handler)  # tests: loopback, a free port
        self._httpd.daemon_threads = True
        self._httpd.fake = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-telegram", daemon=True)

    # --- lifecycle -------------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """What TELEGRAM_BASE_URL should be to reach this server (the token is appended by the client)."""
        return f"http://{self._httpd.server_address[0]}:{self.port}/bot"

    def start(self) -> "FakeTelegramServer":
        """Start serving in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release long polls and stop serving; close the clients' kept-alive connections, as a process that ends
        does (idempotent)."""
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed already
        self._thread.join(timeout=5)

    def restarted(self) -> "FakeTelegramServer":
        """Stop this server and start a new one at the same address for the same bot, keeping nothing of its own:
        its update ids start at 1 again, as a Bot API server restarted without its working folder. Message ids go
        on: they are Telegram's, not the Bot API server's."""
        self.stop()
        server = FakeTelegramServer(token=self.token, bot_id=self.bot.id, bot_username=self.bot.username or "",
                                    drafts=self.drafts, port=self.port)
        server._state.next_message_id = dict(self._state.next_message_id)
        return server.start()

    def __enter__(self) -> "FakeTelegramServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- what users do ---------------------------------------------------------------------------------------

    def push_update(self, kind: str, message: dict[str, Any]) -> int:
        """Queue an update of `kind` (message, edited_message, channel_post...) and return its update id."""
        with self._changed:
            update_id = next(self._update_ids)
            self._state.updates.append({"update_id": update_id, kind: message})
            self._state.pushed[update_id] = self._state.updates[-1]
            self._changed.notify_all()
        return update_id

    def pushed(self, update_id: int) -> dict[str, Any]:
        """The update queued under `update_id`, as the bot received it."""
        with self._lock:
            return self._state.pushed[update_id]

    def redeliver(self, update_id: int) -> None:
        """Queue an update again, same id: what Telegram does when it never saw the confirmation."""
        with self._changed:
            self._state.updates.append(self._state.pushed[update_id])
            self._state.updates.sort(key=lambda u: u["update_id"])
            self._changed.notify_all()

    def send_text(self, chat: Chat, user: User, text: str, *, reply_to: int | None = None,
                  thread_id: int | None = None) -> int:
        """`user` writes `text` in `chat` (commands and @mentions get their entities); returns the message id."""
        message = self._user_message(chat, user, thread_id, reply_to)
        message["text"] = text
        entities = _entities(text)
        if entities:
            message["entities"] = entities
        self.push_update("message", message)
        return message["message_id"]

    def send_sticker(self, chat: Chat, user: User) -> int:
        """`user` sends a sticker (no text) in `chat`; returns the message id."""
        message = self._user_message(chat, user, None, None)
        message["sticker"] = {"file_id": "sticker-1", "file_unique_id": "s1", "type": "regular",
                              "width": 512, "height": 512, "is_animated": False, "is_video": False}
        self.push_update("message", message)
        return message["message_id"]

    def send_document(self, chat: Chat, user: User, name: str, content: bytes, *, caption: str | None = None,
                      mime_type: str = "application/octet-stream", reply_to: int | None = None,
                      file_size: int | None = None) -> int:
        """`user` sends the file `name` holding `content` (with a `caption`, whose /command gets its entity), as
        Telegram delivers documents; returns the message id. `file_size` overrides the size the message declares
        (a file too big to download is never stored whole)."""
        message = self._user_message(chat, user, None, reply_to)
        message["document"] = self.add_file(name, content, mime_type, file_size)
        if caption is not None:
            message["caption"] = caption
            if _entities(caption):
                message["caption_entities"] = _entities(caption)
        self.push_update("message", message)
        return message["message_id"]

    def add_file(self, name: str, content: bytes, mime_type: str = "application/octet-stream",
                 file_size: int | None = None) -> dict[str, Any]:
        """Store a file for getFile and downloads; its Document object as a message carries it."""
        with self._lock:
            number = len(self._state.files) + 1
            file_id = f"doc-{number}-{name}"
            self._state.files[file_id] = (f"documents/file_{number}{_suffix(name)}", content)
        return {"file_id": file_id, "file_unique_id": f"u{number}", "file_name": name, "mime_type": mime_type,
                "file_size": len(content) if file_size is None else file_size}

    def _keep_file(self, data: bytes, folder: str, extension: str, *, size: int | None = None) -> dict[str, Any]:
        """Keep `data` as a file a user sent (a recording, a photo); returns its File fields (`size` overrides what is
        declared)."""
        with self._lock:
            number = len(self._state.files) + 1
            file_id, path = f"file-{number}", f"{folder}/file_{number}.{extension}"
            self._state.files[file_id] = (path, data)
        return {"file_id": file_id, "file_unique_id": f"u{number}", "file_size": len(data) if size is None else size}

    def send_voice(self, chat: Chat, user: User, data: bytes, duration: int, *, kind: str = "voice",
                   caption: str | None = None, reply_to: int | None = None, size: int | None = None) -> int:
        """`user` sends a recording: a voice note (OGG/Opus), an `audio` file or a `video_note`; returns the
        message id. `duration` is what Telegram declares (whole seconds)."""
        media = {**self._keep_file(data, "voice" if kind == "voice" else kind + "s", "oga" if kind == "voice" else
                                 "mp4" if kind == "video_note" else "mp3", size=size), "duration": duration}
        if kind == "voice":
            media["mime_type"] = "audio/ogg"
        elif kind == "video_note":
            media["length"] = 240
        return self._send_media(chat, user, {kind: media}, caption, reply_to)

    def send_photo(self, chat: Chat, user: User, data: bytes, width: int, height: int, *,
                   caption: str | None = None, reply_to: int | None = None, media_group_id: str | None = None) -> int:
        """`user` sends a photo, in the sizes Telegram makes of it (a thumbnail, and the original here); returns the
        message id."""
        thumbnail = self._keep_file(data, "photos", "jpg")
        original = self._keep_file(data, "photos", "jpg")
        sizes = [{**thumbnail, "width": max(1, width // 10), "height": max(1, height // 10)},
                 {**original, "width": width, "height": height}]
        extra = {"media_group_id": media_group_id} if media_group_id else {}
        return self._send_media(chat, user, {"photo": sizes, **extra}, caption, reply_to)

    def _send_media(self, chat: Chat, user: User, fields: dict[str, Any], caption: str | None,
                    reply_to: int | None) -> int:
        message = self._user_message(chat, user, None, reply_to)
        message.update(fields)
        if caption is not None:
            message["caption"] = caption
            if entities := _entities(caption):
                message["caption_entities"] = entities
        self.push_update("message", message)
        return message["message_id"]

    def push_message(self, chat: Chat, user: User | None, *, kind: str = "message", **fields: Any) -> int:
        """Any message as an update of `kind` (message, edited_message, channel_post...), for bad-input tests:
        `fields` add e.g. photo, poll, forward_origin or sender_chat, and a `text` gets its entities; with
        `user=None` it has no `from`, as in channels. Returns the update id. Not kept for replies or edits."""
        with self._lock:
            message: dict[str, Any] = {"message_id": self._new_message_id(chat.id), "date": int(time.time()),
                                       "chat": chat.as_dict()}
        if user is not None:
            message["from"] = user.as_dict()
        message.update(fields)
        if isinstance(fields.get("text"), str) and "entities" not in fields and _entities(fields["text"]):
            message["entities"] = _entities(fields["text"])
        return self.push_update(kind, message)

    def edit_text(self, chat: Chat, user: User, message_id: int, text: str) -> int:
        """`user` edits their message `message_id` to `text`; returns the update id."""
        with self._lock:
            original = dict(self._state.messages[(chat.id, message_id)])
        original.update(text=text, edit_date=int(time.time()), entities=_entities(text))
        return self.push_update("edited_message", original)

    def _user_message(self, chat: Chat, user: User, thread_id: int | None, reply_to: int | None) -> dict[str, Any]:
        with self._lock:
            message: dict[str, Any] = {"message_id": self._new_message_id(chat.id), "date": int(time.time()),
                                       "chat": chat.as_dict(), "from": user.as_dict()}
            if thread_id is not None:
                message.update(message_thread_id=thread_id, is_topic_message=True)
            if reply_to is not None:
                message["reply_to_message"] = dict(self._state.messages[(chat.id, reply_to)])
            self._state.messages[(chat.id, message["message_id"])] = message
        return message

    def _new_message_id(self, chat_id: int) -> int:
        number = self._state.next_message_id.get(chat_id, 1)
        self._state.next_message_id[chat_id] = number + 1
        return number

    # --- scripting failures ----------------------------------------------------------------------------------

    def fail(self, method: str, *, status: int = 500, description: str = "", retry_after: float | None = None,
             times: int = 1, when: Callable[[dict[str, Any]], bool] | None = None, delay: float = 0.0,
             drop: bool = False, applied: bool = False, for_seconds: float | None = None) -> Failure:
        """Make the next `times` calls of `method` (those `when` accepts) fail; `times=-1` means always.

        `for_seconds` makes it an outage instead: every matching call fails until that many seconds from now.
        `applied` lets the call take effect before its answer is delayed or dropped (see `Failure`).
        """
        failure = Failure(method, status, description or _default_description(status, retry_after), retry_after,
                          -1 if for_seconds is not None else times, when, delay, drop, applied,
                          None if for_seconds is None else time.monotonic() + for_seconds)
        with self._lock:
            self.failures.append(failure)
        return failure

    def _take_failure(self, method: str, params: dict[str, Any]) -> Failure | None:
        with self._lock:
            for failure in self.failures:
                if failure.active(method, params):
                    failure.times -= 1 if failure.times > 0 else 0
                    return failure
        return None

    # --- what tests read -------------------------------------------------------------------------------------

    def calls_to(self, method: str, *, ok: bool | None = None) -> list[ApiCall]:
        """Recorded calls of `method`, in arrival order (only successful ones with ok=True)."""
        with self._lock:
            return [c for c in self.calls if c.method == method and (ok is None or c.ok == ok)]

    def statuses(self, method: str) -> list[int]:
        """The HTTP status of each recorded call of `method`, in order (0: the connection was dropped unanswered)."""
        return [call.status for call in self.calls_to(method)]

    def sent(self, chat_id: int | None = None) -> list[ApiCall]:
        """Messages the server accepted from the bot (sendMessage answered 200), optionally in one chat."""
        return [c for c in self.calls_to("sendMessage", ok=True) if chat_id is None or c.params["chat_id"] == chat_id]

    def draft_texts(self, chat_id: int) -> list[str]:
        """The visible texts of the drafts the server accepted in a chat, in order."""
        texts = [(str(c.params.get("text") or ""), c.params.get("parse_mode"))
                 for c in self.calls_to("sendMessageDraft", ok=True) if c.params["chat_id"] == chat_id]
        return [_visible_text(body, mode) if body else "" for body, mode in texts]

    def documents(self, chat_id: int | None = None) -> list[SentDocument]:
        """The documents the server accepted from the bot (optionally in one chat), in order."""
        with self._lock:
            return [d for d in self._state.sent_documents if chat_id is None or d.chat_id == chat_id]

    def file_url(self, file_path: str) -> str:
        """Where a file is downloaded from, as the Bot API serves it (getFile gives `file_path`)."""
        return f"http://127.0.0.1:{self.port}/file/bot{self.token}/{file_path}"

    def sent_texts(self, chat_id: int | None = None) -> list[str]:
        """The visible texts of accepted messages, in order."""
        return [c.result["text"] for c in self.sent(chat_id)]

    def visible_messages(self, chat_id: int) -> list[str]:
        """What the chat shows from the bot now: accepted messages after edits and deletions, in order."""
        with self._lock:
            return [m["text"] for (chat, _), m in sorted(self._state.messages.items())
                    if chat == chat_id and m["from"]["id"] == self.bot.id]

    @property
    def pending_updates(self) -> list[int]:
        """Ids of updates not yet confirmed by a getUpdates offset."""
        with self._lock:
            return [u["update_id"] for u in self._state.updates]

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = 5.0, message: str = "") -> Any:
        """Poll `predicate` on the event loop until it is truthy; fail the test after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while not (value := predicate()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting: {message or predicate}")
            await asyncio.sleep(0.01)
        return value

    def forget(self) -> None:
        """Drop recorded calls and stored messages (ids go on), so a long load run's fake stays flat in memory."""
        with self._lock:
            self.calls.clear()
            self._state.messages.clear()
            self._state.pushed = {u["update_id"]: u for u in self._state.updates}  # keep what may be redelivered

    async def settle(self, quiet: float = 0.3) -> None:
        """Wait until no call has arrived for `quiet` seconds (apart from long polls): the bot is idle."""
        while True:
            with self._lock:
                last = max((c.at for c in self.calls if c.method != "getUpdates"), default=0.0)
            left = last + quiet - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(left)

    # --- the Bot API -----------------------------------------------------------------------------------------

    def handle(self, method: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Answer one API call: (HTTP status, JSON body)."""
        handler = getattr(self, f"_api_{method}", None)
        if handler is None:
            return 404, _error(404, "Not Found")
        try:
            return 200, {"ok": True, "result": handler(params)}
        except _ApiError as error:
            return error.status, _error(error.status, error.description)

    def _record(self, method: str, params: dict[str, Any], status: int, body: dict[str, Any]) -> None:
        with self._lock:
            self.calls.append(ApiCall(method, params, status, time.monotonic(), body.get("result")))

    def _api_getMe(self, params: dict[str, Any]) -> dict[str, Any]:
        return {**self.bot.as_dict(), "can_join_groups": True, "can_read_all_group_messages": False,
                "supports_inline_queries": False}

    def _api_getUpdates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        offset, limit = int(params.get("offset") or 0), int(params.get("limit") or 100)
        allowed = params.get("allowed_updates") or None
        deadline = time.monotonic() + float(params.get("timeout") or 0)
        with self._changed:
            self.polls_started += 1
            # Telegram forgets an update once a call's offset is above its id: that is the only confirmation.
            self._state.updates = [u for u in self._state.updates if u["update_id"] >= offset]
            while not (ready := _deliverable(self._state.updates, allowed)) and not self._stopping.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(min(left, 0.1))
            return [json.loads(json.dumps(u)) for u in ready[:limit]]

    def _api_sendMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        text = _visible_text(str(params.get("text", "")), params.get("parse_mode"))
        chat_id = int(params["chat_id"])
        with self._lock:
            message = {"message_id": self._new_message_id(chat_id), "date": int(time.time()),
                       "chat": self._chat_of(chat_id), "from": self.bot.as_dict(), "text": text}
            reply_to = (params.get("reply_parameters") or {}).get("message_id")
            if reply_to is not None and (chat_id, reply_to) in self._state.messages:
                message["reply_to_message"] = dict(self._state.messages[(chat_id, reply_to)])
            if params.get("message_thread_id") is not None:
                message["message_thread_id"] = params["message_thread_id"]
            self._state.messages[(chat_id, message["message_id"])] = message
        return dict(message)  # a copy: the recorded call keeps the text as sent, whatever edits follow

    def _api_sendDocument(self, params: dict[str, Any]) -> dict[str, Any]:
        upload = params.get("document")
        if not isinstance(upload, dict):
            raise _ApiError(400, "Bad Request: this fake takes documents as uploads only")
        if len(upload["data"]) > MAX_UPLOAD_BYTES:
            raise _ApiError(413, "Request Entity Too Large")
        caption = str(params.get("caption") or "")
        if len(caption) > MAX_CAPTION:
            raise _ApiError(400, "Bad Request: message caption is too long")
        chat_id = int(params["chat_id"])
        document = self.add_file(upload["filename"], upload["data"], upload["content_type"])
        with self._lock:
            self._state.sent_documents.append(SentDocument(chat_id, document["file_id"], upload["filename"],
                                                           upload["data"], caption))
            message = {"message_id": self._new_message_id(chat_id), "date": int(time.time()),
                       "chat": self._chat_of(chat_id), "from": self.bot.as_dict(), "caption": caption,
                       "document": document}
        return message

    def _api_sendMessageDraft(self, params: dict[str, Any]) -> bool:
        if not self.drafts:
            raise _ApiError(404, "Not Found")
        chat_id = int(params["chat_id"])
        if chat_id < 0:
            raise _ApiError(400, "Bad Request: TEXTDRAFT_PEER_INVALID")
        if not int(params.get("draft_id") or 0):
            raise _ApiError(400, "Bad Request: draft_id must be non-zero")
        text = str(params.get("text") or "")
        if text:  # an empty draft shows Telegram's "thinking" placeholder
            _visible_text(text, params.get("parse_mode"))
        return True

    def _api_editMessageText(self, params: dict[str, Any]) -> dict[str, Any]:
        text = _visible_text(str(params.get("text", "")), params.get("parse_mode"))
        key = (int(params["chat_id"]), int(params["message_id"]))
        with self._lock:
            message = self._state.messages.get(key)
            if message is None or message["from"]["id"] != self.bot.id:
                raise _ApiError(400, "Bad Request: message to edit not found")
            if message["text"] == text:
                raise _ApiError(400, "Bad Request: message is not modified: specified new message content and "
                                     "reply markup are exactly the same as a current content and reply markup of "
                                     "the message")
            message.update(text=text, edit_date=int(time.time()))
            return dict(message)

    def _api_deleteMessage(self, params: dict[str, Any]) -> bool:
        with self._lock:
            if self._state.messages.pop((int(params["chat_id"]), int(params["message_id"])), None) is None:
                raise _ApiError(400, "Bad Request: message to delete not found")
        return True

    def _api_getFile(self, params: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            stored = self._state.files.get(str(params.get("file_id", "")))
        if stored is None:
            raise _ApiError(400, "Bad Request: invalid file_id")
        path, content = stored
        if len(content) > MAX_DOWNLOAD:
            raise _ApiError(400, "Bad Request: file is too big")
        return {"file_id": params["file_id"], "file_unique_id": params["file_id"], "file_size": len(content),
                "file_path": path}

    def download(self, path: str) -> bytes | None:
        """The content at a getFile `file_path`, or None."""
        with self._lock:
            return next((content for stored, content in self._state.files.values() if stored == path), None)

    def _api_sendChatAction(self, params: dict[str, Any]) -> bool:
        return True

    def _api_setMyCommands(self, params: dict[str, Any]) -> bool:
        return True

    def _api_deleteWebhook(self, params: dict[str, Any]) -> bool:
        self._state.webhook_url = ""
        return True

    def _api_setWebhook(self, params: dict[str, Any]) -> bool:
        self._state.webhook_url = str(params.get("url", ""))
        return True

    def _api_getWebhookInfo(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"url": self._state.webhook_url, "has_custom_certificate": False,
                "pending_update_count": len(self._state.updates)}

    def _chat_of(self, chat_id: int) -> dict[str, Any]:
        for (chat, _), message in self._state.messages.items():
            if chat == chat_id:
                return dict(message["chat"])
        return {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"}


class _ApiError(Exception):
    def __init__(self, status: int, description: str):
        super().__init__(description)
        self.status = status
        self.description = description


def _error(status: int, description: str, retry_after: float | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
    if retry_after is not None:
        body["parameters"] = {"retry_after": retry_after}
    return body


def _default_description(status: int, retry_after: float | None) -> str:
    if status == 429:
        return f"Too Many Requests: retry after {retry_after or 1:g}"
    return {400: "Bad Request: fake failure", 403: "Forbidden: bot was blocked by the user",
            502: "Bad Gateway"}.get(status, "Internal Server Error")


def _deliverable(updates: list[dict[str, Any]], allowed: list[str] | None) -> list[dict[str, Any]]:
    if not allowed:
        return list(updates)
    return [u for u in updates if any(kind in u for kind in allowed)]


def _entities(text: str) -> list[dict[str, Any]]:
    """The entities Telegram would attach: a leading /command, and @mentions (offsets in UTF-16 units)."""
    entities = []
    if text.startswith("/"):
        command = text.split(maxsplit=1)[0]
        entities.append({"type": "bot_command", "offset": 0, "length": _utf16_len(command)})
    position = 0
    for word in text.split(" "):
        stripped = word.rstrip(",.!?:;，。！？")
        if stripped.startswith("@") and len(stripped) > 1:
            offset = _utf16_len(text[:text.index(word, position)])
            entities.append({"type": "mention", "offset": offset, "length": _utf16_len(stripped)})
        position += len(word) + 1
    return entities


def _suffix(name: str) -> str:
    dot = name.rfind(".")
    return name[dot:] if dot > 0 else ""


def _utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def _visible_text(text: str, parse_mode: str | None) -> str:
    """The text a user would see, refusing what Telegram refuses: empty, too long, unparseable HTML."""
    if parse_mode == "HTML":
        text = _HTMLChecker().visible(text)
    elif parse_mode:
        raise _ApiError(400, f"Bad Request: unsupported parse_mode {parse_mode!r} in this fake")
    if not text.strip():
        raise _ApiError(400, "Bad Request: message text is empty")
    if len(text) > MAX_TEXT:
        raise _ApiError(400, "Bad Request: message is too long")
    return text


class _HTMLChecker(HTMLParser):
    """Telegram's HTML subset: known tags only, properly nested and closed."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.parts: list[str] = []

    def visible(self, markup: str) -> str:
        self.feed(markup)
        self.close()
        if self.stack:
            raise _ApiError(400, f"Bad Request: can't parse entities: can't find end tag corresponding to start "
                                 f"tag \"{self.stack[-1]}\"")
        return "".join(self.parts)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in HTML_TAGS:
            raise _ApiError(400, f"Bad Request: can't parse entities: unsupported start tag \"{tag}\"")
        self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            raise _ApiError(400, f"Bad Request: can't parse entities: unmatched end tag \"{tag}\"")
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # room for many simultaneous connections (see the fake OpenAI server)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client hanging up on a kept-alive connection (the bot shutting down) needs no traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle's algorithm the body waits for the client's delayed ACK
    # (40 ms on Linux), so every call on a kept-alive connection would take 40 ms longer than it should.
    disable_nagle_algorithm = True

    @property
    def fake(self) -> FakeTelegramServer:
        return self.server.fake  # type: ignore[attr-defined]

    def setup(self) -> None:
        super().setup()
        with self.fake._lock:
            self.fake._connections.add(self.connection)

    def finish(self) -> None:
        with self.fake._lock:
            self.fake._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass  # the connection was shut down by `stop`

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        """Stay quiet: tests assert on recorded calls."""

    def do_GET(self) -> None:
        """GET works for parameterless methods such as getMe, as on the real server (and file downloads)."""
        self._serve({})

    def do_POST(self) -> None:
        """POST with a form, a JSON body, or a multipart upload, as PTB sends."""
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        kind = self.headers.get("Content-Type", "")
        if kind.startswith("multipart/form-data"):
            params = _multipart(kind, body)
        elif kind.startswith("application/json"):
            params = json.loads(body.decode("utf-8") or "{}")
        else:
            raw = body.decode("utf-8")
            params = {key: _decode(key, value) for key, value in parse_qsl(raw, keep_blank_values=True)}
        self._serve(params)

    def _serve(self, params: dict[str, Any]) -> None:
        files = f"/file/bot{self.fake.token}/"
        if unquote(self.path).startswith(files):  # clients quote the path, the token's colon included
            return self._serve_file(unquote(self.path)[len(files):])
        prefix = f"/bot{self.fake.token}/"
        if not self.path.startswith(prefix):
            return self._send(401, _error(401, "Unauthorized"))
        method = self.path[len(prefix):].split("?")[0]
        failure = self.fake._take_failure(method, params)
        if failure and failure.applied:
            return self._lose_answer(method, params, failure)
        if failure and failure.delay and self.fake._stopping.wait(failure.delay):
            return
        if failure and failure.drop:
            self.fake._record(method, params, 0, {})
            return self._drop()
        if failure and failure.status != 200:
            status, body = failure.status, _error(failure.status, failure.description, failure.retry_after)
        else:
            status, body = self.fake.handle(method, params)
        self.fake._record(method, params, status, body)
        self._send(status, body)

    def _serve_file(self, path: str) -> None:
        """A file download, as the real server serves one: the bytes, or 404."""
        content = self.fake.download(path.split("?")[0])
        self.fake._record("download", {"file_path": path}, 200 if content is not None else 404, {})
        if content is None:
            return self._send(404, _error(404, "Not Found"))
        with self.fake._lock:
            self.fake.files_fetched.append(path.split("?")[0])
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        try:
            self.wfile.write(content)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _lose_answer(self, method: str, params: dict[str, Any], failure: Failure) -> None:
        """Carry the call out (recorded as accepted), then answer it late, or drop the connection instead."""
        status, body = self.fake.handle(method, params)
        self.fake._record(method, params, status, body)
        if failure.delay and self.fake._stopping.wait(failure.delay):
            return
        if failure.drop:
            self._drop()
        else:
            self._send(status, body)

    def _drop(self) -> None:
        """Close the connection without a word, as a crashed proxy or a lost network path does."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)  # now, not when the handler's file objects are closed
        except OSError:
            pass  # the client already went away
        self.connection.close()

    def _send(self, status: int, payload: Any) -> None:
        data = json_bytes(payload)
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (a cancelled long poll): nothing to answer


def _multipart(content_type: str, body: bytes) -> dict[str, Any]:
    """The fields of a multipart/form-data body: text fields as in a form, files as {filename, data, content_type}."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode("latin-1") + body)
    params: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True) or b""
        filename = part.get_filename()
        if filename is not None:
            params[name] = {"filename": filename, "data": data, "content_type": part.get_content_type()}
        else:
            params[name] = _decode(name, data.decode("utf-8"))
    return params


def _decode(key: str, value: str) -> Any:
    if key not in JSON_FIELDS:
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


# --- standalone: the fake as a process of its own (deploy/check/run_check.sh talks to a container with it) ---------

def ask_and_wait(server: FakeTelegramServer, user: User, question: str, timeout: float) -> dict[str, Any]:
    """`user` asks `question` in a private chat once the bot polls; the answer (the bot's first message replying
    to it) or, after `timeout`, what the chat shows."""
    deadline = time.monotonic() + timeout
    while not server.polls_started and time.monotonic() < deadline:
        time.sleep(0.1)
    message_id = server.send_text(private_chat(user), user, question)
    while time.monotonic() < deadline:
        for call in server.sent(user.id):
            if (call.params.get("reply_parameters") or {}).get("message_id") == message_id:
                return {"question": question, "answer": call.result["text"]}
        time.sleep(0.1)
    return {"question": question, "answer": None, "chat": server.visible_messages(user.id)}


def main(argv: list[str] | None = None) -> int:
    """Serve the fake Bot API on HOST:PORT; each line read from stdin is a question from one user, answered on
    stdout as one JSON line. Serves on after stdin ends, until SIGTERM or SIGINT."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--user-id", type=int, default=1001)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each answer")
    args = parser.parse_args(argv)
    server = FakeTelegramServer(host=args.host, port=args.port, drafts=False).start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(json.dumps({"listening": server.base_url, "token": server.token}), flush=True)
    user = User(args.user_id, "Operator", "en")
    try:
        for line in sys.stdin:
            if line.strip():
                print(json.dumps(ask_and_wait(server, user, line.strip(), args.timeout), ensure_ascii=False),
                      flush=True)
        signal.pause()
    finally:
        calls = {}
        for call in server.calls:
            calls[call.method] = calls.get(call.method, 0) + 1
        print(json.dumps({"calls": calls}), flush=True)
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
