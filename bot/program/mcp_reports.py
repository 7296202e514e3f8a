"""What admins are told about MCP servers, the same in Telegram (/mcp_*, in the admin's language) and the terminal
(`qwenbot mcp`, in English).

Nothing here prints a header value: servers are shown through `ServerSpec.where`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.program.texts import add_texts, text
from tools.mcp import Listing, McpHub, left_out_text
from tools.mcp_store import ServerSpec, ToolInfo

if TYPE_CHECKING:
    from tools.mcp_client import McpConnection

STATE_MARKS = {"connected": "🟢", "connecting": "🟡", "down": "🔴", "idle": "⚪"}
TEXTS = {
    "mcp_tool_read_only": {"zh": "• {name} — 只读", "en": "• {name} — read-only"},
    "mcp_tool_writes": {"zh": "• {name} — {access}：只能用 /tool_on {name} destructive 启用",
                        "en": "• {name} — {access}: enable only with /tool_on {name} destructive"},
    "mcp_added": {"zh": "✅ 已添加 {name}（{where}）。", "en": "✅ Added {name} ({where})."},
    "mcp_all_off": {"zh": "所有工具都是停用的。在本聊天启用一个：/tool_on {example}，在所有聊天启用：/tool_on {example} global。",
                    "en": "Every tool is off. Enable one here with /tool_on {example}, or everywhere with "
                          "/tool_on {example} global."},
    "mcp_tool_count": {"zh": "{count} 个工具：", "en": "{count} tools:"},
    "mcp_one_tool": {"zh": "1 个工具：", "en": "1 tool:"},
    "mcp_no_tools": {"zh": "没有工具。", "en": "No tools."},
    "mcp_new": {"zh": "新增：{names}", "en": "New: {names}"},
    "mcp_gone": {"zh": "消失：{names}", "en": "Gone: {names}"},
    "mcp_changed": {"zh": "有变化：{names}", "en": "Changed: {names}"},
    "mcp_reset": {"zh": "已在所有聊天停用（它现在可能修改数据；要再启用，请加上 destructive）：{names}",
                  "en": "Turned off everywhere (it may now change data; enable it again with the flag): {names}"},
    "mcp_skipped": {"zh": "没有提供：{reasons}", "en": "Not offered: {reasons}"},
    "mcp_refreshed": {"zh": "🔄 已重新列出 {name} 的工具。{listing}", "en": "🔄 {name} listed again. {listing}"},
    "mcp_no_servers": {"zh": "还没有 MCP 服务器。", "en": "No MCP servers yet."},
    "mcp_down": {"zh": "不可用：{error}", "en": "down: {error}"},
    "mcp_server_tools": {"zh": "{count} 个工具：{tools}", "en": "{count} tool(s): {tools}"},
    "mcp_none_known": {"zh": "还不知道", "en": "none known"},
}
add_texts(TEXTS)


def tool_line(server: str, info: ToolInfo, lang: str = "en") -> str:
    """One tool: full name, what it may do to data, and how to enable it."""
    name = f"{server}.{info.name}"
    if info.read_only:
        return text("mcp_tool_read_only", lang, name=name)
    return text("mcp_tool_writes", lang, name=name, access=info.access)


def added_text(spec: ServerSpec, listing: Listing, lang: str = "en") -> str:
    """The answer to a server added: where it is, its tools (all off), and how to enable one."""
    lines = [text("mcp_added", lang, name=spec.name, where=spec.where), listing_text(listing, lang)]
    if listing.tools:
        lines.append(text("mcp_all_off", lang, example=f"{spec.name}.{listing.tools[0].name}"))
    return "\n".join(lines)


def listing_text(listing: Listing, lang: str = "en") -> str:
    """A server's tools, and what changed since its last listing."""
    count = len(listing.tools)
    key = "mcp_no_tools" if not count else "mcp_one_tool" if count == 1 else "mcp_tool_count"
    lines = [text(key, lang, count=count) if count > 1 else text(key, lang)]
    lines += [tool_line(listing.server, info, lang) for info in listing.tools]
    for key, names in (("mcp_new", listing.added), ("mcp_gone", listing.removed), ("mcp_changed", listing.changed),
                       ("mcp_reset", listing.reset)):
        if names:
            lines.append(text(key, lang, names=", ".join(_full(listing.server, n) for n in names)))
    if listing.skipped:
        lines.append(text("mcp_skipped", lang, reasons="; ".join(listing.skipped)))
    if listing.left_out or listing.more_unread:
        lines.append(f"⚠️ {left_out_text(listing)}.")  # in English: tools/mcp.py words it
    return "\n".join(lines)


def refreshed_text(listing: Listing, lang: str = "en") -> str:
    """The answer to /mcp_refresh."""
    return text("mcp_refreshed", lang, name=listing.server, listing=listing_text(listing, lang))


def servers_text(hub: McpHub, lang: str = "en") -> str:
    """Every server: state, where it is, where it is declared, its tools."""
    connections = hub.servers()
    if not connections:
        return text("mcp_no_servers", lang)
    return "\n\n".join(server_text(c, hub.listings.get(c.spec.name, []), lang) for c in connections)


def server_text(connection: "McpConnection", tools: list[ToolInfo], lang: str = "en") -> str:
    """One server for /mcp_list and `qwenbot mcp list`."""
    spec = connection.spec
    lines = [f"{STATE_MARKS[connection.state]} {spec.name} — {spec.where} ({spec.origin})"]
    if connection.last_error:
        lines.append(text("mcp_down", lang, error=connection.last_error))
    names = ", ".join(f"{t.name} ({t.access})" for t in tools) or text("mcp_none_known", lang)
    lines.append(text("mcp_server_tools", lang, count=len(tools), tools=names))
    return "\n".join(lines)


def _full(server: str, name: str) -> str:
    return f"{server}.{name}"
