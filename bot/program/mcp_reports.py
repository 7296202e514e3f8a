"""What admins are told about MCP servers, the same in Telegram (/mcp_*) and the terminal (`qwenbot mcp`).

Nothing here prints a header value: servers are shown through `ServerSpec.where`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tools.mcp import Listing, McpHub, left_out_text
from tools.mcp_store import ServerSpec, ToolInfo

if TYPE_CHECKING:
    from tools.mcp_client import McpConnection

STATE_MARKS = {"connected": "🟢", "connecting": "🟡", "down": "🔴", "idle": "⚪"}


def tool_line(server: str, info: ToolInfo) -> str:
    """One tool: full name, what it may do to data, and how to enable it."""
    name = f"{server}.{info.name}"
    if info.read_only:
        return f"• {name} — read-only"
    return f"• {name} — {info.access}: enable only with /tool_on {name} destructive"


def added_text(spec: ServerSpec, listing: Listing) -> str:
    """The answer to a server added: where it is, its tools (all off), and how to enable one."""
    lines = [f"✅ Added {spec.name} ({spec.where}).", listing_text(listing)]
    if listing.tools:
        example = f"{spec.name}.{listing.tools[0].name}"
        lines.append(f"Every tool is off. Enable one here with /tool_on {example}, or everywhere with "
                     f"/tool_on {example} global.")
    return "\n".join(lines)


def listing_text(listing: Listing) -> str:
    """A server's tools, and what changed since its last listing."""
    count = len(listing.tools)
    lines = [f"{count} tool{'s' if count != 1 else ''}:" if count else "No tools."]
    lines += [tool_line(listing.server, info) for info in listing.tools]
    for label, names in (("New", listing.added), ("Gone", listing.removed), ("Changed", listing.changed),
                         ("Turned off everywhere (it may now change data; enable it again with the flag)",
                          listing.reset)):
        if names:
            lines.append(f"{label}: {', '.join(_full(listing.server, n) for n in names)}")
    if listing.skipped:
        lines.append("Not offered: " + "; ".join(listing.skipped))
    if listing.left_out or listing.more_unread:
        lines.append(f"⚠️ {left_out_text(listing)}.")
    return "\n".join(lines)


def refreshed_text(listing: Listing) -> str:
    """The answer to /mcp_refresh."""
    return f"🔄 {listing.server} listed again. " + listing_text(listing)


def servers_text(hub: McpHub) -> str:
    """Every server: state, where it is, where it is declared, its tools."""
    connections = hub.servers()
    if not connections:
        return "No MCP servers yet."
    return "\n\n".join(server_text(c, hub.listings.get(c.spec.name, [])) for c in connections)


def server_text(connection: "McpConnection", tools: list[ToolInfo]) -> str:
    """One server for /mcp_list and `qwenbot mcp list`."""
    spec = connection.spec
    lines = [f"{STATE_MARKS[connection.state]} {spec.name} — {spec.where} ({spec.origin})"]
    if connection.last_error:
        lines.append(f"down: {connection.last_error}")
    lines.append(f"{len(tools)} tool(s): " + (", ".join(f"{t.name} ({t.access})" for t in tools) or "none known"))
    return "\n".join(lines)


def _full(server: str, name: str) -> str:
    return f"{server}.{name}"
