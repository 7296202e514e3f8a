"""MCP servers as a tool source: each server's tools join the registry as `NAME.tool`, off until an admin enables them.

    hub = McpHub(db, registry, config=read_config(path), limits=McpLimits(...))
    await hub.start()                   # cached listings registered at once; connecting happens in the background
    listing = await hub.add(spec, by)   # /mcp_add: connect, list, store, register
    await hub.close()

An MCP tool is an ordinary registry `Tool`: its JSON Schema validates the arguments, the registry's time limit
bounds the call, the agent truncates the result into the Observation. What the server says about a tool is a hint
from a stranger, so a tool not marked read-only counts as changing data: enabling it takes an admin's explicit flag
(tools/settings.py) and every call to it is audited. A tool result is text for the Observation, nothing more.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from jsonschema.exceptions import SchemaError

from db import Database
from db.secret_box import SecretBox, key_file_beside
from tools.errors import McpConfigError, McpToolError, ServerUnavailable
from tools.mcp_store import (FROM_CONFIG, ServerSpec, ToolInfo, cached_tools, delete_server, forget_listings,
                             save_listing, save_server, stored_server, stored_servers)
from tools.registry import Tool, ToolRegistry

if TYPE_CHECKING:  # the SDK takes seconds to import: only a bot that connects to a server loads it
    import mcp_types

    from tools.mcp_client import McpConnection

log = logging.getLogger(__name__)

# The names MCP recommends for tools; anything else could not be written after `Action:` reliably.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class McpLimits:
    """The MCP limits. These defaults are the only ones: `Settings` takes its defaults from here."""

    connect_timeout_seconds: float = 10.0
    retry_seconds: float = 30.0
    max_tools_per_server: int = 50
    description_max_chars: int = 1000
    # Admin-added servers may be on loopback, private and link-local addresses (tools/mcp_addresses.py).
    allow_private_addresses: bool = False


@dataclass
class Listing:
    """A server's tools after a listing, and what changed since the one before."""

    server: str
    tools: list[ToolInfo]
    skipped: list[str] = field(default_factory=list)  # "name: why"
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # parameters, description or access changed
    reset: list[str] = field(default_factory=list)  # enabled once, now changing data: turned off everywhere
    left_out: int = 0  # usable tools past `limit` (MCP_MAX_TOOLS_PER_SERVER), not taken
    more_unread: bool = False  # the server had further pages of tools, not read
    limit: int = McpLimits.max_tools_per_server


# --- from the server's listing to registry tools ---------------------------------------------------------------

def tool_info(tool: "mcp_types.Tool", description_max_chars: int) -> ToolInfo:
    """What the bot keeps of a listed tool. A tool counts as read-only only when its server says so, and as
    destructive unless it says otherwise (MCP's defaults)."""
    hints = tool.annotations
    read_only = getattr(hints, "read_only_hint", None) is True
    title = tool.title or getattr(hints, "title", None) or ""
    description = " ".join((tool.description or "").split())[:description_max_chars]
    return ToolInfo(tool.name, title, description, dict(tool.input_schema), read_only,
                    not read_only and getattr(hints, "destructive_hint", None) is not False)


def registry_tool(server: str, info: ToolInfo, call: Any) -> Tool:
    """The registry's view of an MCP tool: `server.tool`, off by default, calling through `call`."""
    return Tool(
        name=f"{server}.{info.name}", human_name=info.title or info.name,
        description=info.description or f"{info.name} on the {server} MCP server.",
        parameters={"type": "object", "properties": {}, **info.input_schema},
        function=partial(call, server, info.name), progress=f"🔌 {server}: {info.title or info.name}",
        enabled_by_default=False, source=f"mcp:{server}", read_only=info.read_only, destructive=info.destructive)


def first_of_each_name(infos: list[ToolInfo]) -> tuple[list[ToolInfo], list[str]]:
    """(each name's first tool, "name: why" for each later one): a listing naming a tool twice is the server's
    mistake, and the bot can offer one tool per name."""
    kept: dict[str, ToolInfo] = {}
    skipped = []
    for info in infos:
        if info.name in kept:
            skipped.append(f"{info.name[:64]}: listed twice by the server; the first one is kept")
        else:
            kept[info.name] = info
    return list(kept.values()), skipped


def usable_tools(server: str, infos: list[ToolInfo], call: Any) -> tuple[list[Tool], list[str]]:
    """(registry tools, "name: why" for each listed tool that cannot be offered)."""
    tools, skipped = [], []
    for info in infos:
        if not TOOL_NAME.match(info.name):
            skipped.append(f"{info.name[:64]}: the name has characters a model cannot write after Action:")
            continue
        try:
            tools.append(registry_tool(server, info, call))
        except SchemaError as error:
            skipped.append(f"{info.name}: its input schema is not valid JSON Schema ({error.message})")
    return tools, skipped


def result_text(result: "mcp_types.CallToolResult") -> str:
    """A tool result as Observation text: text blocks as they are, other content named, never executed."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False)]
    return "\n".join(parts) or "(the tool returned nothing)"


def _block_text(block: Any) -> str:
    """One content block by its MCP `type`: text, an embedded text resource, a link; the rest only named."""
    kind = getattr(block, "type", "content")
    if kind == "text":
        return block.text
    if kind == "resource" and isinstance(getattr(block.resource, "text", None), str):
        return block.resource.text
    if kind == "resource_link":
        return f"[resource {block.name}: {block.uri}]"
    return f"[{kind}: {getattr(block, 'mime_type', '') or 'binary'}, not shown]"


def changes(before: list[ToolInfo], after: list[ToolInfo]) -> tuple[list[str], list[str], list[str]]:
    """(added, removed, changed) tool names between two listings."""
    old, new = {t.name: t for t in before}, {t.name: t for t in after}
    return ([n for n in new if n not in old], [n for n in old if n not in new],
            [n for n in new if n in old and new[n] != old[n]])


# --- the hub ---------------------------------------------------------------------------------------------------

class McpHub:
    """The MCP servers the bot knows (config file and database), their connections, and their tools."""

    def __init__(self, db: Database, registry: ToolRegistry, *, config: list[ServerSpec] = (),
                 limits: McpLimits = McpLimits(), box: SecretBox | None = None):
        self.db = db
        self.registry = registry
        # Seals the secrets of admin-added servers in the database; by default its key sits beside the database.
        self.box = box or SecretBox.at(key_file_beside(db.path))
        self.config = list(config)
        self.limits = limits
        self.connections: dict[str, "McpConnection"] = {}
        self.listings: dict[str, list[ToolInfo]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._background: list[asyncio.Task] = []

    async def start(self, connect: bool = True) -> None:
        """Register every server's cached tools now; list each server afresh in the background (if `connect`)."""
        specs = {spec.name: spec for spec in await stored_servers(self.db, self.box)}
        for spec in self.config:  # the file at the server wins over the database
            if spec.name in specs:
                log.warning("MCP server %s is in the config file and in the database: the config file's is used",
                            spec.name)
            specs[spec.name] = spec
        await forget_listings(self.db, specs)
        cached = await cached_tools(self.db)
        for spec in specs.values():
            self._install(spec, cached.get(spec.name, []))
        if connect:
            self._background = [asyncio.create_task(self._refresh_quietly(name), name=f"mcp-start:{name}")
                                for name in specs]

    async def close(self) -> None:
        """Stop background listings and close every connection (stdio servers exit)."""
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in self.connections.values()), return_exceptions=True)

    def servers(self) -> list["McpConnection"]:
        """Every known server's connection, in the order they were loaded."""
        return list(self.connections.values())

    def secrets(self) -> list[str]:
        """Every secret of the known servers (header and environment values, URL credentials): for the redactor
        (core/secrets.py), never for display."""
        return [value for connection in self.connections.values() for value in connection.spec.secrets]

    # --- admin actions ---------------------------------------------------------------------------------------

    async def add(self, spec: ServerSpec, added_by: int | None) -> Listing:
        """Connect to a new server and list its tools; store and register them only when that worked."""
        if spec.name in self.connections or await stored_server(self.db, spec.name, self.box):
            raise McpConfigError(f"a server named {spec.name} exists already")
        connection = self._connection(spec)
        try:
            infos, listing = await self._list(connection, None)
            await save_server(self.db, spec, infos, added_by, self.box)
        except BaseException:
            await connection.close()
            raise
        self.connections[spec.name] = connection
        self._register(spec.name, infos)
        return listing

    async def remove(self, name: str) -> list[str]:
        """Forget an admin-added server and its tools' settings; returns the tools it had."""
        connection = self.connections.get(name)
        if connection is not None and connection.spec.origin == FROM_CONFIG:
            raise McpConfigError(f"{name} is declared in the MCP config file: remove it there and restart")
        removed = [tool.name for tool in self.registry.from_source(f"mcp:{name}")]
        if not await delete_server(self.db, name) and connection is None:
            raise KeyError(name)
        self.registry.replace_source(f"mcp:{name}", [])
        self.connections.pop(name, None)
        self.listings.pop(name, None)
        if connection is not None:
            await connection.close()
        return removed

    async def refresh(self, name: str) -> Listing:
        """Connect afresh and list again (a server added with `qwenbot mcp add` is loaded here)."""
        connection = await self._known(name)
        async with self._lock(name):
            await connection.reconnect()
            return await self._relist(connection)

    # --- calls -----------------------------------------------------------------------------------------------

    async def call(self, server: str, tool: str, /, **arguments: Any) -> str:
        """Tool function of every MCP tool: the result's text, or a ToolError the model reads as its Observation."""
        connection = self.connections.get(server)
        if connection is None:
            raise ServerUnavailable(f"MCP server {server} has been removed")
        try:
            result = await connection.call_tool(tool, arguments)
        except ServerUnavailable:
            raise
        except McpToolError as refused:  # the server refused the request itself (unknown tool, bad parameters)
            raise McpToolError(f"{refused}{await self._after_error(connection, tool)}") from None
        if not result.is_error:
            return result_text(result)
        note = await self._after_error(connection, tool)
        raise McpToolError(f"{server}.{tool} failed: {connection.scrub(result_text(result))}{note}")

    async def _after_error(self, connection: "McpConnection", tool: str) -> str:
        """List again after a failed call: a changed or removed tool explains the failure to the model."""
        name = connection.spec.name
        try:
            async with self._lock(name):
                listing = await self._relist(connection)
        except McpToolError:
            return ""
        if tool in listing.removed:
            return f"\n{name}.{tool} no longer exists on the server."
        if tool in listing.changed and (current := self.registry.get(f"{name}.{tool}")) is not None:
            log.warning("MCP server %s changed the tool %s", name, tool)
            return (f"\nThe server has changed this tool; its parameters are now: "
                    f"{json.dumps(current.parameter_list, ensure_ascii=False)}")
        return ""

    # --- listings --------------------------------------------------------------------------------------------

    async def _refresh_quietly(self, name: str) -> None:
        """A start-up listing: logged, never raised, never waited for."""
        connection = self.connections[name]
        try:
            async with self._lock(name):
                listing = await self._relist(connection)
        except McpToolError as error:
            log.warning("%s; its %d known tool(s) stay listed", error, len(self.listings.get(name, [])))
            return
        except Exception:
            log.exception("listing the tools of MCP server %s failed", name)
            return
        log.info("MCP server %s: %d tool(s)%s", name, len(listing.tools), _change_note(listing))

    async def _relist(self, connection: "McpConnection") -> Listing:
        """List a known server's tools, store the listing, swap its registry tools."""
        name = connection.spec.name
        before = self.listings.get(name, [])
        infos, listing = await self._list(connection, before)
        if infos != before:  # most listings find nothing new: no write then
            listing.reset = [f"{name}.{t}" for t in listing.changed if _began_changing_data(before, infos, t)]
            await save_listing(self.db, name, infos, listing.reset)
            self._register(name, infos)
        return listing

    async def _list(self, connection: "McpConnection",
                    before: list[ToolInfo] | None) -> tuple[list[ToolInfo], Listing]:
        """The usable tools a server lists now (the first MCP_MAX_TOOLS_PER_SERVER of them), and what changed since
        `before` (None: a first listing)."""
        name, limit = connection.spec.name, self.limits.max_tools_per_server
        tools, more_unread = await connection.list_tools(limit)
        infos, twice = first_of_each_name([tool_info(t, self.limits.description_max_chars) for t in tools])
        usable, unusable = usable_tools(name, infos, self.call)
        offered = {tool.name for tool in usable}
        kept = [info for info in infos if f"{name}.{info.name}" in offered]
        listing = Listing(name, kept[:limit], twice + unusable, *changes(before or kept[:limit], kept[:limit]),
                          left_out=max(0, len(kept) - limit), more_unread=more_unread, limit=limit)
        return kept[:limit], listing

    def _install(self, spec: ServerSpec, infos: list[ToolInfo]) -> None:
        self.connections[spec.name] = self._connection(spec)
        self._register(spec.name, infos)

    def _register(self, name: str, infos: list[ToolInfo]) -> None:
        self.listings[name] = infos
        self.registry.replace_source(f"mcp:{name}", usable_tools(name, infos, self.call)[0])

    def _connection(self, spec: ServerSpec) -> "McpConnection":
        from tools.mcp_client import McpConnection  # here: the SDK loads with the first server

        return McpConnection(spec, connect_timeout=self.limits.connect_timeout_seconds,
                             retry_seconds=self.limits.retry_seconds,
                             allow_private=self.limits.allow_private_addresses)

    async def _known(self, name: str) -> "McpConnection":
        """The connection of `name`, loading an admin-added server the hub has not seen yet; KeyError if none."""
        stored = await stored_server(self.db, name, self.box)
        connection = self.connections.get(name)
        if connection is None and stored is not None:
            self._install(stored, [])
        elif connection is not None and stored is None and connection.spec.origin != FROM_CONFIG:
            await self.remove(name)  # deleted with `qwenbot mcp del` while the bot ran
            raise KeyError(name)
        if name not in self.connections:
            raise KeyError(name)
        return self.connections[name]

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())


def _began_changing_data(before: list[ToolInfo], after: list[ToolInfo], name: str) -> bool:
    """Whether tool `name` was read-only before and is not now (its old enabling no longer covers it)."""
    old = next((t for t in before if t.name == name), None)
    new = next((t for t in after if t.name == name), None)
    return old is not None and new is not None and old.read_only and not new.read_only


def _change_note(listing: Listing) -> str:
    parts = [f"{what}: {', '.join(names)}" for what, names in (
        ("added", listing.added), ("removed", listing.removed), ("changed", listing.changed),
        ("turned off, now changing data", listing.reset), ("skipped", listing.skipped)) if names]
    if listing.left_out or listing.more_unread:
        parts.append(left_out_text(listing))
    return f" ({'; '.join(parts)})" if parts else ""


def left_out_text(listing: Listing) -> str:
    """How many listed tools were not taken, and why, in one line."""
    count = f"{listing.left_out}{' or more' if listing.more_unread else ''}"
    noun = "tool" if count == "1" else "tools"
    return (f"{count} more {noun} left out: at most {listing.limit} are taken from one server "
            "(MCP_MAX_TOOLS_PER_SERVER)")
