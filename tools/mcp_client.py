"""One MCP server's connection, through the official SDK's `mcp.Client`: lazy, time-limited, and never in the way.

The SDK's client lives in anyio task groups bound to the task that opens it, and a failing transport cancels that
task. So a holder task of its own opens the client and waits; callers use it from their own tasks (the session
takes concurrent requests), and a transport that fails ends the holder only. A call that finds the connection
gone, or a server that hangs up mid-call, gets `ServerUnavailable`; the next call connects again, at most once per
`retry_seconds` after a failed attempt, so a server that is down costs a turn one quick observation.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import anyio
import httpx2
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from core.secrets import redact
from tools.errors import McpToolError, PrivateAddress, ServerUnavailable
from tools.mcp_addresses import check_public_url
from tools.mcp_store import FROM_CONFIG, ServerSpec

log = logging.getLogger(__name__)

# What the SDK raises when the transport under a request fails: the request never got (or lost) its answer.
TRANSPORT_ERRORS = (httpx2.HTTPError, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)
# HTTP timeouts of the SDK's own default client: a response stream may stay open, so reads wait long.
HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)


class McpConnection:
    """A client session with one server, opened on first use and reopened after it fails."""

    def __init__(self, spec: ServerSpec, *, connect_timeout: float, retry_seconds: float,
                 allow_private: bool = False):
        self.spec = spec
        self.connect_timeout = connect_timeout
        self.retry_seconds = retry_seconds
        # Admin-added servers must be on public addresses unless allowed (tools/mcp_addresses.py); the config
        # file's are the host owner's own.
        self.check_address = not allow_private and spec.transport != "stdio" and spec.origin != FROM_CONFIG
        self.last_error: str | None = None
        self._client: Client | None = None
        self._holder: asyncio.Task | None = None
        self._release = asyncio.Event()
        self._lock = asyncio.Lock()
        self._failed_at: float | None = None
        self._http_status: int | None = None

    @property
    def state(self) -> str:
        """connected, connecting, down (the last attempt failed) or idle (not connected yet)."""
        if self._client is not None:
            return "connected"
        return "connecting" if self._lock.locked() else "down" if self.last_error else "idle"

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        """Call the server's tool `name`; ServerUnavailable when the server cannot answer, McpToolError when it
        refuses the request."""
        client = await self.client()
        try:
            return await client.call_tool(name, arguments)
        except BaseException as error:
            raise await self._failure(client, error, "the call") from None

    async def list_tools(self, limit: int) -> tuple[list[mcp_types.Tool], bool]:
        """The server's tools, page by page, within the connect time limit, until more than `limit` differently
        named ones are known; and whether pages were left unread."""
        client = await self.client()
        tools: list[mcp_types.Tool] = []
        cursor = None
        try:
            async with asyncio.timeout(self.connect_timeout):
                while True:
                    page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                    tools += page.tools
                    cursor = page.next_cursor
                    if not cursor or len({tool.name for tool in tools}) > limit:
                        break
        except BaseException as error:
            raise await self._failure(client, error, "listing its tools") from None
        return tools, bool(cursor)

    async def client(self) -> Client:
        """The open client, connecting first when there is none (one attempt at a time)."""
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is not None:
                return self._client
            self._wait_out_failure()
            return await self._connect()

    async def reconnect(self) -> None:
        """Drop the session and forget the last failure: the next use connects at once."""
        await self.close()
        self.last_error, self._failed_at = None, None

    async def close(self) -> None:
        """End the session (a stdio server's process ends with it)."""
        holder, self._client = self._holder, None
        self._release.set()
        if holder is not None:
            await _stop(holder, self.connect_timeout)

    # --- connecting --------------------------------------------------------------------------------------------

    def _wait_out_failure(self) -> None:
        if self._failed_at is None:
            return
        left = self._failed_at + self.retry_seconds - asyncio.get_running_loop().time()
        if left > 0:
            raise ServerUnavailable(f"MCP server {self.spec.name} is down ({self.last_error}); "
                                    f"the next try is in {left:.0f} s")

    async def _connect(self) -> Client:
        if self.check_address:
            try:
                await check_public_url(self.spec.url)
            except PrivateAddress as refused:
                self.last_error, self._failed_at = str(refused), asyncio.get_running_loop().time()
                raise ServerUnavailable(f"MCP server {self.spec.name} is not contacted: {refused}") from None
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._release = asyncio.Event()
        self._http_status = None
        holder = asyncio.create_task(self._hold(ready, self._release), name=f"mcp:{self.spec.name}")
        try:
            async with asyncio.timeout(self.connect_timeout):
                client = await asyncio.shield(ready)
        except BaseException as error:  # a failure, the time limit, or our caller cancelled: the holder goes too
            ready.cancel()
            await _stop(holder, 0)
            if isinstance(error, TimeoutError):
                raise self._failed(f"no answer within {self.connect_timeout:g} s") from None
            if isinstance(error, Exception):
                raise self._failed(self.describe(error)) from None
            raise
        self._client, self._holder, self.last_error, self._failed_at = client, holder, None, None
        return client

    async def _hold(self, ready: asyncio.Future, release: asyncio.Event) -> None:
        """Open the client, hand it over, and keep it open until released or its transport fails."""
        try:
            async with Client(self._transport(), client_info=CLIENT_INFO) as client:
                ready.set_result(client)
                await release.wait()
        except BaseException as error:  # the transport failed, or close() stopped us: either way the session ends
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception) else ConnectionError("cancelled"))
            elif self._holder is asyncio.current_task() and not release.is_set():
                log.info("MCP server %s: the connection ended (%s)", self.spec.name, self.describe(error))
        finally:
            if self._holder is asyncio.current_task():
                self._client = None

    def _failed(self, reason: str) -> ServerUnavailable:
        self.last_error, self._failed_at = reason, asyncio.get_running_loop().time()
        return ServerUnavailable(f"MCP server {self.spec.name} is unreachable: {reason}")

    async def _failure(self, client: Client, error: BaseException, doing: str) -> Exception:
        """What a failed request means for the caller; a failed transport also ends this session."""
        if isinstance(error, asyncio.CancelledError):
            return error  # the caller's time limit or cancellation: the session itself is fine
        if isinstance(error, (TimeoutError, asyncio.TimeoutError)):
            return ServerUnavailable(f"MCP server {self.spec.name} did not finish {doing} within "
                                     f"{self.connect_timeout:g} s")
        if isinstance(error, MCPError) and error.code != mcp_types.CONNECTION_CLOSED and not _session_lost(error):
            return McpToolError(f"MCP server {self.spec.name} refused {doing}: {self.scrub(error.message[:300])}")
        if isinstance(error, ValidationError):
            return McpToolError(f"MCP server {self.spec.name} answered {doing} with {NOT_MCP}")
        if not isinstance(error, (MCPError, *TRANSPORT_ERRORS, BaseExceptionGroup)):
            raise error  # a bug of ours or the SDK's: the registry logs it
        if self._client is client:
            await self.close()
        self.last_error = f"the connection was lost during {doing}"
        return ServerUnavailable(f"MCP server {self.spec.name} went away during {doing} "
                                 f"({self.describe(error)}); it is tried again on the next call")

    # --- transports ----------------------------------------------------------------------------------------------

    def _transport(self) -> Any:
        if self.spec.transport == "stdio":
            return StdioServerParameters(command=self.spec.command, args=list(self.spec.args),
                                         env=dict(self.spec.env) or None, cwd=self.spec.cwd)
        return self._http_streams()

    @asynccontextmanager
    async def _http_streams(self) -> AsyncIterator[Any]:
        """Streamable HTTP or SSE with the spec's headers, noting any error status for the admin's message."""
        async def note_status(response: httpx2.Response) -> None:
            if response.status_code >= 400:
                self._http_status = response.status_code

        def http_client(headers: dict[str, str] | None = None, timeout: Any = None, auth: Any = None):
            return httpx2.AsyncClient(headers={**(headers or {}), **self.spec.headers}, timeout=timeout or HTTP_TIMEOUT,
                                      auth=auth, event_hooks={"response": [note_status]})

        if self.spec.transport == "sse":
            async with sse_client(self.spec.url, httpx_client_factory=http_client) as streams:
                yield streams
            return
        async with http_client() as http, streamable_http_client(self.spec.url, http_client=http) as streams:
            yield streams

    # --- words for people --------------------------------------------------------------------------------------

    def describe(self, error: BaseException) -> str:
        """A failure in one short line, without tracebacks, without the spec's secrets, and without quoting what the
        other end answered: whatever sits at an admin's URL (the Bot API with the token in its path, a model
        server, an internal service) must not have its answer repeated into the chat."""
        leaf = _leaf(error)
        if self._http_status in (401, 403):
            text = f"the server answered HTTP {self._http_status}: check the headers"
        elif self._http_status is not None:
            text = f"the server answered HTTP {self._http_status}"
        elif isinstance(leaf, httpx2.ConnectError):
            text = "nothing answers at that address"
        elif isinstance(leaf, httpx2.TransportError):
            text = f"the connection failed ({type(leaf).__name__})"
        elif isinstance(leaf, FileNotFoundError):
            text = f"cannot start {self.spec.command!r}: no such command"
        elif isinstance(leaf, MCPError):
            text = _mcp_error_text(leaf)
        elif isinstance(leaf, (ValidationError, ValueError)):
            text = NOT_MCP
        elif isinstance(leaf, OSError):  # our own side's words (a refused connection, a closed pipe)
            text = f"{type(leaf).__name__}: {leaf}" if str(leaf) else type(leaf).__name__
        else:
            text = type(leaf).__name__
        return self.scrub(text)

    def scrub(self, text: str) -> str:
        """`text` with every header and environment value of the spec replaced, should a server echo one, and every
        other secret the process knows (core/secrets.py)."""
        for secret in [*self.spec.headers.values(), *self.spec.env.values()]:
            if len(secret) >= 4:
                text = text.replace(secret, "***")
        return redact(text)


CLIENT_INFO = mcp_types.Implementation(name="qwen-react-bot", version="0.1.0")
NOT_MCP = "something that is not MCP (is the URL an MCP endpoint?)"
# Errors the SDK raises itself, in its own words (no text of the other end in them).
_SDK_MESSAGES = ("Session terminated", "Connection closed")


def _mcp_error_text(error: MCPError) -> str:
    """An MCP error during connecting: the SDK's own words, or the error code only (the message of a server, or
    the SDK quoting a body it could not parse, is the other end's text)."""
    if error.message in _SDK_MESSAGES:
        return error.message
    if error.code == mcp_types.PARSE_ERROR or error.message.startswith("Failed to parse"):
        return NOT_MCP
    return f"it refused the MCP handshake (error {error.code})"


def _session_lost(error: MCPError) -> bool:
    """Whether a server answered that it no longer knows our session (it restarted): only a new session helps."""
    return error.code == mcp_types.INVALID_REQUEST and error.message == "Session terminated"


def _leaf(error: BaseException) -> BaseException:
    """The first real error inside (possibly nested) exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


async def _stop(holder: asyncio.Task, grace: float) -> None:
    """Let a released holder close its client; cancel it if it has not within `grace` seconds."""
    done, _ = await asyncio.wait([holder], timeout=grace) if grace > 0 else (set(), None)
    if not done and not holder.done():
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
