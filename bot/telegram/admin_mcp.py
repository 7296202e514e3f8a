"""Admin commands for MCP servers: /mcp_add, /mcp_list, /mcp_del, /mcp_refresh. Refused for everyone else; every
change audited.

Only servers reached over HTTP are added here: a stdio server is a command line, which is code execution and
belongs in the config file at the server (MCP_CONFIG_PATH). Header values are secrets: no reply or audit row
repeats them, and the admin's message that carried them is deleted from the chat at once.
"""

from __future__ import annotations

import shlex

from telegram import Update

from bot.program.logs import add_secrets
from bot.program.mcp_reports import added_text, refreshed_text, servers_text
from bot.program.texts import text
from bot.telegram.admin import admin_only, arguments, error_and_usage, record, usage
from bot.telegram.chat import reply, user_language
from bot.telegram.context import BotContext
from bot.telegram.replies import quietly
from tools.errors import McpConfigError, McpToolError
from tools.mcp_store import ServerSpec, parse_headers, url_server

# Phones turn straight quotes into curly ones; shlex only knows the straight kind.
_QUOTES = str.maketrans({"“": '"', "”": '"', "„": '"', "‘": "'", "’": "'"})


def command_words(update: Update) -> list[str]:
    """The words after the command, with shell-style quoting; ValueError for an unclosed quote."""
    text = (update.effective_message.text or "").translate(_QUOTES)
    return shlex.split(text)[1:]


async def mcp_add(update: Update, context: BotContext) -> None:
    """/mcp_add NAME URL [Header=value …]: connect a server, list its tools (all off), store it."""
    if not await admin_only(update, context):
        return
    message, lang = update.effective_message, user_language(update)
    await forget_message_with_secrets(update)
    try:
        spec = parse_add(command_words(update))
    except (ValueError, McpConfigError) as error:
        return await error_and_usage(update, "mcp_add", error)
    add_secrets(spec.secrets)
    try:
        listing = await context.services.mcp.add(spec, update.effective_user.id)
    except McpConfigError as error:
        return await reply(message, text("mcp_see_list", lang, error=error))
    except McpToolError as error:
        return await reply(message, text("mcp_not_added", lang, name=spec.name, error=error))
    await record(update, context, "mcp_add", f"{spec.name} {spec.where}")
    await reply(message, added_text(spec, listing, lang))


def parse_add(words: list[str]) -> ServerSpec:
    """NAME URL [Header=value …] as a checked server spec."""
    if len(words) < 2:
        raise McpConfigError("a name and a URL are needed")
    return url_server(words[0], words[1], parse_headers(words[2:]))


async def forget_message_with_secrets(update: Update) -> None:
    """Delete the admin's message when it may hold a secret (a header, or a URL with a query or credentials);
    a failure to delete is only logged."""
    words = arguments(update)
    if len(words) > 2 or any(mark in " ".join(words[1:2]) for mark in "?@"):
        await quietly(update.effective_message.delete(), "deleting the /mcp_add message")


async def mcp_list(update: Update, context: BotContext) -> None:
    """/mcp_list: every MCP server, its state and its tools."""
    if not await admin_only(update, context):
        return
    await reply(update.effective_message, servers_text(context.services.mcp, user_language(update)))


async def mcp_del(update: Update, context: BotContext) -> None:
    """/mcp_del NAME: forget a server, its tools and their settings."""
    if not await admin_only(update, context):
        return
    args, lang = arguments(update), user_language(update)
    if len(args) != 1:
        return await usage(update, "mcp_del")
    try:
        removed = await context.services.mcp.remove(args[0])
    except KeyError:
        return await reply(update.effective_message, text("mcp_no_server", lang, name=repr(args[0])))
    except McpConfigError as error:
        return await reply(update.effective_message, text("error", lang, error=f"{error}."))
    await record(update, context, "mcp_del", args[0])
    if removed:
        return await reply(update.effective_message,
                           text("mcp_removed_tools", lang, name=args[0], tools=", ".join(removed)))
    await reply(update.effective_message, text("mcp_removed", lang, name=args[0]))


async def mcp_refresh(update: Update, context: BotContext) -> None:
    """/mcp_refresh NAME: connect again and list the server's tools, saying what changed."""
    if not await admin_only(update, context):
        return
    args, lang = arguments(update), user_language(update)
    if len(args) != 1:
        return await usage(update, "mcp_refresh")
    hub = context.services.mcp
    try:
        listing = await hub.refresh(args[0])  # may load a server `qwenbot mcp add` stored: its secrets join the filter
    except KeyError:
        return await reply(update.effective_message, text("mcp_no_server", lang, name=repr(args[0])))
    except McpToolError as error:
        known = len(hub.listings.get(args[0], []))
        return await reply(update.effective_message, text("mcp_refresh_failed", lang, error=error, known=known))
    finally:
        add_secrets(hub.secrets())
    await record(update, context, "mcp_refresh", f"{args[0]}: {len(listing.tools)} tools")
    await reply(update.effective_message, refreshed_text(listing, lang))
