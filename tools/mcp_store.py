"""Where MCP servers come from, and what they offered last.

    MCP_CONFIG_PATH   a JSON file in the `mcpServers` shape other MCP clients read: stdio servers (a command) and URL
                      servers, declared by whoever runs the bot. Read once, at start.
    mcp_servers       URL servers (streamable HTTP or SSE) admins add at run time; never a command.
    mcp_tools         each server's last tool listing, so its tools are known before (or without) connecting.

Header values are secrets: `ServerSpec` keeps them out of its repr, and `where` (what admins are shown) names the
headers without their values and the URL without credentials or query values. In the database they are sealed
(db/secret_box.py, with a key outside it): the plain columns hold only what `where` shows (migration 0013).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from core.secrets import url_secrets
from db import Database
from db.secret_box import SecretBox
from tools.errors import McpConfigError

SERVER_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
# Header names are RFC 9110 tokens; values must not hold line breaks (header injection).
HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
# Environment variables whose values are secrets, by name (as log scrubbers such as Sentry's go by key names).
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS|AUTH|CRED|PRIVATE|SESSION|COOKIE|SIGNATURE", re.IGNORECASE)
URL_TRANSPORTS = ("http", "sse")
TRANSPORT_LABELS = {"http": "streamable HTTP", "sse": "SSE", "stdio": "stdio"}
FROM_CONFIG, FROM_DATABASE = "config file", "database"


@dataclass(frozen=True)
class ServerSpec:
    """How to reach one MCP server."""

    name: str
    transport: str  # http (streamable HTTP), sse, or stdio
    url: str = field(default="", repr=False)  # may carry credentials or a token in its query
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # values are secrets
    command: str = ""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold secrets too
    cwd: str | None = None
    origin: str = FROM_DATABASE

    @property
    def source(self) -> str:
        """The `Tool.source` of this server's tools."""
        return f"mcp:{self.name}"

    @property
    def secrets(self) -> list[str]:
        """Every value of this spec that is a secret: header values, the URL's credentials, and environment values
        named like a secret (or holding a URL with credentials). Other environment values are not: a stdio server's
        PYTHONPATH or LOG_LEVEL, redacted everywhere, would blank out every path and word they share."""
        env = [value for name, value in self.env.items() if SECRET_NAME.search(name)]
        return [*self.headers.values(), *env, *url_secrets(self.url),
                *(secret for value in self.env.values() for secret in url_secrets(value) if "://" in value)]

    @property
    def where(self) -> str:
        """The server as admins are shown it: transport, URL without secrets (or the command), header names."""
        if self.transport == "stdio":
            return f"stdio: {' '.join([self.command, *self.args])}"
        shown = f"{TRANSPORT_LABELS[self.transport]} {public_url(self.url)}"
        return shown + (f", headers {', '.join(sorted(self.headers))} (values hidden)" if self.headers else "")


@dataclass(frozen=True)
class ToolInfo:
    """One tool as its server listed it."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    destructive: bool

    @property
    def access(self) -> str:
        """read-only, writes or destructive (as `Tool.access`)."""
        return "read-only" if self.read_only else "destructive" if self.destructive else "writes"


# --- definitions: checked words in, a spec out ---------------------------------------------------------------

def check_name(name: str) -> str:
    """A server name as stored: it prefixes tool names, so letters, digits, - and _ only."""
    if not SERVER_NAME.match(name):
        raise McpConfigError(f"server name {name!r} must be 1-32 characters: a lowercase letter, then lowercase "
                             "letters, digits, - or _")
    return name


def check_url(url: str) -> str:
    """An http(s) URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise McpConfigError(f"{public_url(url)!r} is not an http:// or https:// URL")
    return url


def url_transport(url: str) -> str:
    """SSE for an endpoint ending in /sse (the old HTTP+SSE transport's convention), streamable HTTP otherwise."""
    return "sse" if urlsplit(url).path.rstrip("/").endswith("/sse") else "http"


def parse_headers(words: Iterable[str]) -> dict[str, str]:
    """`Name=value` words as headers; refuses anything else, naming the word's header name but never its value."""
    headers: dict[str, str] = {}
    for word in words:
        name, equals, value = word.partition("=")
        if not equals or not HEADER_NAME.match(name):
            raise McpConfigError("headers are written Name=value (quote a value with spaces: "
                                 '"Authorization=Bearer TOKEN")')
        if not value or "\r" in value or "\n" in value:
            raise McpConfigError(f"header {name} needs a value on one line")
        headers[name] = value
    return headers


def url_server(name: str, url: str, headers: Mapping[str, str], origin: str = FROM_DATABASE,
               transport: str | None = None) -> ServerSpec:
    """A checked spec for a server reached over HTTP."""
    return ServerSpec(check_name(name), transport or url_transport(url), check_url(url), dict(headers),
                      origin=origin)


def public_url(url: str) -> str:
    """The URL without user:password and with query values hidden: either may carry a secret."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    query = urlencode([(key, "***") for key, _ in parse_qsl(parts.query, keep_blank_values=True)], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


# --- the config file -----------------------------------------------------------------------------------------

def read_config(path: Path | None) -> list[ServerSpec]:
    """The servers declared in the `mcpServers` JSON file at `path` (none when `path` is empty)."""
    if not path or not str(path).strip():
        return []
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise McpConfigError(f"cannot read MCP_CONFIG_PATH {path}: {error}") from None
    servers = document.get("mcpServers") if isinstance(document, dict) else None
    if not isinstance(servers, dict):
        raise McpConfigError(f'{path} must hold a JSON object {{"mcpServers": {{"NAME": {{...}}}}}}')
    return [config_server(name, entry, path) for name, entry in servers.items()]


def config_server(name: str, entry: Any, path: Path) -> ServerSpec:
    """One `mcpServers` entry: {"command", "args", "env", "cwd"} for stdio, {"url", "headers", "type"} for HTTP."""
    try:
        if not isinstance(entry, dict):
            raise McpConfigError("must be a JSON object")
        if entry.get("command"):
            return stdio_server(name, entry)
        if entry.get("url"):
            kind = str(entry.get("type") or entry.get("transport") or "").lower()
            transport = "sse" if kind == "sse" else "http" if kind else None
            return url_server(name, str(entry["url"]), _strings(entry.get("headers"), "headers"), FROM_CONFIG,
                              transport)
        raise McpConfigError('needs a "command" (stdio) or a "url"')
    except McpConfigError as error:
        raise McpConfigError(f"{path}: server {name!r}: {error}") from None


def stdio_server(name: str, entry: dict[str, Any]) -> ServerSpec:
    """A server the bot starts as a child process and talks to over its stdin and stdout."""
    args = entry.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError('"args" must be a list of strings')
    cwd = entry.get("cwd")
    return ServerSpec(check_name(name), "stdio", command=str(entry["command"]), args=tuple(args),
                      env=_strings(entry.get("env"), "env"), cwd=str(cwd) if cwd else None, origin=FROM_CONFIG)


def _strings(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise McpConfigError(f'"{what}" must be an object of strings')
    return dict(value)


# --- the database --------------------------------------------------------------------------------------------

_SERVER_COLUMNS = "name, transport, url, headers, sealed"


async def stored_servers(db: Database, box: SecretBox) -> list[ServerSpec]:
    """The servers admins added, oldest first, their secrets opened with `box`."""
    rows = await db.fetchall(f"SELECT {_SERVER_COLUMNS} FROM mcp_servers ORDER BY added_at, name")
    return [_stored_spec(row, box) for row in rows]


async def stored_server(db: Database, name: str, box: SecretBox) -> ServerSpec | None:
    """The admin-added server called `name`, or None."""
    row = await db.fetchone(f"SELECT {_SERVER_COLUMNS} FROM mcp_servers WHERE name = ?", (name,))
    return None if row is None else _stored_spec(row, box)


def _stored_spec(row: Any, box: SecretBox) -> ServerSpec:
    """A row as a spec: the sealed URL and headers when the row has them (plain ones from before migration 0013)."""
    name, transport, url, headers, sealed = row
    if sealed is None:
        return ServerSpec(name, transport, url, json.loads(headers))
    secret = json.loads(box.open(sealed))
    return ServerSpec(name, transport, secret["url"], secret["headers"])


def _stored_columns(spec: ServerSpec, box: SecretBox) -> tuple[str, str, str]:
    """(url, headers, sealed) as stored: only what may be shown in the plain columns, the secrets sealed."""
    sealed = box.seal(json.dumps({"url": spec.url, "headers": dict(spec.headers)}, ensure_ascii=False))
    return public_url(spec.url), json.dumps({name: "" for name in spec.headers}), sealed


async def save_server(db: Database, spec: ServerSpec, tools: list[ToolInfo], added_by: int | None,
                      box: SecretBox) -> None:
    """Store a new server (its secrets sealed with `box`) and its first listing together."""
    async with db.transaction() as conn:
        await conn.execute("INSERT INTO mcp_servers (name, transport, url, headers, sealed, added_by) "
                           "VALUES (?, ?, ?, ?, ?, ?)", (spec.name, spec.transport, *_stored_columns(spec, box),
                                                         added_by))
        await _replace_tools(conn, spec.name, tools)


async def seal_plain_servers(db: Database, box: SecretBox) -> int:
    """Seal the secrets of servers stored before migration 0013, in place; how many rows. The plain values are
    overwritten with zeros in the file (the connection's secure_delete) and the write-ahead log is emptied, so no
    copy of them stays behind."""
    rows = await db.fetchall(f"SELECT {_SERVER_COLUMNS} FROM mcp_servers WHERE sealed IS NULL")
    if not rows:
        return 0
    async with db.transaction() as conn:
        for row in rows:
            url, headers, sealed = _stored_columns(_stored_spec(row, box), box)
            await conn.execute("UPDATE mcp_servers SET url = ?, headers = ?, sealed = ? WHERE name = ?",
                               (url, headers, sealed, row[0]))
    await db.checkpoint()
    return len(rows)


async def delete_server(db: Database, name: str) -> int:
    """Forget a server, its listing and its tools' settings (a server re-added later starts all off).
    Returns how many servers were removed (0 or 1)."""
    async with db.transaction() as conn:
        cursor = await conn.execute("DELETE FROM mcp_servers WHERE name = ?", (name,))
        await conn.execute("DELETE FROM mcp_tools WHERE server = ?", (name,))
        await conn.execute("DELETE FROM tool_settings WHERE substr(tool_name, 1, ?) = ?",
                           (len(name) + 1, name + "."))
        return cursor.rowcount


async def cached_tools(db: Database) -> dict[str, list[ToolInfo]]:
    """Every server's last listing, by server name."""
    rows = await db.fetchall("SELECT server, name, title, description, input_schema, read_only, destructive "
                             "FROM mcp_tools ORDER BY server, rowid")
    listings: dict[str, list[ToolInfo]] = {}
    for server, name, title, description, schema, read_only, destructive in rows:
        listings.setdefault(server, []).append(
            ToolInfo(name, title, description, json.loads(schema), bool(read_only), bool(destructive)))
    return listings


async def save_listing(db: Database, server: str, tools: list[ToolInfo], reset: Iterable[str] = ()) -> None:
    """Replace a server's cached listing; turn the tools named in `reset` (full names) off everywhere."""
    async with db.transaction() as conn:
        await _replace_tools(conn, server, tools)
        for tool_name in reset:
            await conn.execute("DELETE FROM tool_settings WHERE tool_name = ?", (tool_name,))


async def forget_listings(db: Database, keep: Iterable[str]) -> None:
    """Drop the listings of servers that are no longer declared anywhere."""
    names = list(keep)
    marks = ", ".join("?" for _ in names) or "''"
    async with db.transaction() as conn:
        await conn.execute(f"DELETE FROM mcp_tools WHERE server NOT IN ({marks})", names)


async def _replace_tools(conn: Any, server: str, tools: list[ToolInfo]) -> None:
    await conn.execute("DELETE FROM mcp_tools WHERE server = ?", (server,))
    await conn.executemany(
        "INSERT INTO mcp_tools (server, name, title, description, input_schema, read_only, destructive) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        [(server, t.name, t.title, t.description, json.dumps(t.input_schema, ensure_ascii=False), int(t.read_only),
          int(t.destructive)) for t in tools])
