"""MCP servers through Telegram: an admin connects a real MCP server (written with the SDK, on 127.0.0.1 and over
stdio), enables its tools, and a scripted-model turn calls one and answers from its result. Faults (an error, a
hang, a server stopped mid-turn, a changed schema) end as observations or clear admin messages; start-up never
waits for a server; header secrets appear in no reply, no log line and no audit row.

Non-admins get the usual refusal for every /mcp_* command: tests/test_security.py checks every admin command.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys

import pytest

from bot.program.logs import redact_handlers
from tests.fakes.mcp_process import HangingServer, McpServerProcess, free_port, stdio_entry
from tests.fakes.telegram_bot import ADMIN, RunningBot, final, private_chat, start_bot, telegram_server

__all__ = ["start_bot", "telegram_server"]  # fixtures used by name

SECRET = "s3cret-header-value-8086"
CHAT = private_chat(ADMIN)


def act(tool: str, **arguments: str) -> str:
    """A model reply calling `tool`."""
    return (f"Thought: I should ask the weather desk.\nAction: {tool}\n"
            f"Action Input: {json.dumps(arguments, ensure_ascii=False)}\nObservation:")


@pytest.fixture(scope="module")
def weather(tmp_path_factory):
    """The weather desk over streamable HTTP, behind the X-Api-Key header (shared: nothing here changes it but
    deleting Lima)."""
    server = McpServerProcess.launch(tmp_path_factory.mktemp("mcp"), header=f"X-Api-Key={SECRET}")
    yield server
    server.stop()


async def add_weather(bot: RunningBot, url: str, header: str = f"X-Api-Key={SECRET}") -> str:
    """The admin adds the weather desk (with `header`, if any); returns the bot's answer."""
    quoted = f' "{header}"' if header else ""
    return await bot.ask(CHAT, ADMIN, f"/mcp_add weather {url}{quoted}")


def watch_the_log(caplog: pytest.LogCaptureFixture) -> None:
    """Capture every record, DEBUG included (python-telegram-bot and aiosqlite log raw updates and SQL there),
    through the filter `qwenbot run` installs."""
    caplog.set_level(logging.DEBUG)
    redact_handlers([caplog.handler])


def everything_said(bot: RunningBot) -> str:
    """Every text the bot sent to Telegram, in every call."""
    return "\n".join(json.dumps(call.params, ensure_ascii=False) for call in bot.server.calls)


# --- the acceptance path ---------------------------------------------------------------------------------------

async def test_an_admin_connects_a_server_enables_the_read_only_tool_and_a_turn_answers_from_it(
        start_bot, telegram_server, weather, caplog):
    watch_the_log(caplog)
    bot = await start_bot([act("weather.forecast", city="Paris"), final("Paris: 21°C and sunny today.")],
                          mcp_allow_private_addresses=True)

    added = await add_weather(bot, weather.url)
    assert added.startswith(f"✅ Added weather (streamable HTTP {weather.url}, headers X-Api-Key (values hidden))")
    assert "• weather.forecast — read-only" in added
    assert "• weather.delete_city — destructive: enable only with /tool_on weather.delete_city destructive" in added
    assert telegram_server.calls_to("deleteMessage")  # the message that carried the secret is gone from the chat

    listing = await bot.ask(CHAT, ADMIN, "/tools all")
    assert "⛔ weather.forecast — forecast (default) · mcp:weather, read-only" in listing
    assert "⛔ weather.delete_city — delete_city (default) · mcp:weather, destructive" in listing
    refused = await bot.ask(CHAT, ADMIN, "/tool_on weather.delete_city")
    assert refused.startswith("⚠️ weather.delete_city stays off: it may change or delete data")
    assert refused.endswith("To enable it anyway: /tool_on weather.delete_city destructive")
    assert await bot.ask(CHAT, ADMIN, "/tool_on weather.forecast") == "✅ weather.forecast is on in this chat."

    answer = await bot.ask(CHAT, ADMIN, "What is the weather in Paris?")
    assert answer == "Paris: 21°C and sunny today."
    first, second = bot.llm.requests
    assert "weather.forecast: Call this tool to interact with the forecast API." in first.text
    assert "Today's weather in a city." in first.text and "delete_city" not in first.text
    assert "Observation: Paris: 21°C, sunny" in second.last_content
    assert first.messages[0]["role"] == "system" and "21°C" not in second.messages[0]["content"]
    assert await bot.query("SELECT action, observation, error FROM steps WHERE kind = 'tool'") == [
        ("weather.forecast", "Paris: 21°C, sunny", None)]
    assert [c for c in weather.calls() if "delete_city" in c] == []

    assert "🟢 weather" in await bot.ask(CHAT, ADMIN, "/mcp_list")
    assert (await bot.ask(CHAT, ADMIN, "/mcp_refresh weather")).startswith("🔄 weather listed again. 2 tools:")
    removed = await bot.ask(CHAT, ADMIN, "/mcp_del weather")
    assert removed == ("✅ Removed weather and its tools (weather.forecast, weather.delete_city); their settings "
                       "are forgotten.")
    assert "weather." not in await bot.ask(CHAT, ADMIN, "/tools all")
    assert await bot.query("SELECT * FROM tool_settings") == []

    audit = await bot.query("SELECT user_id, action, detail FROM audit_log ORDER BY id")
    assert [row[1] for row in audit] == ["mcp_add", "tool_on", "mcp_refresh", "mcp_del"]
    assert audit[0] == (ADMIN.id, "mcp_add", f"weather streamable HTTP {weather.url}, headers X-Api-Key "
                                             "(values hidden)")
    for where, text in (("replies", everything_said(bot)), ("log", caplog.text), ("audit", str(audit))):
        assert SECRET not in text, where


async def test_a_destructive_tool_needs_the_flag_and_every_call_is_audited_with_its_arguments(
        start_bot, telegram_server, weather):
    bot = await start_bot([act("weather.delete_city", city="Lima"), final("Lima is gone.")],
                          mcp_allow_private_addresses=True)
    await add_weather(bot, weather.url)
    assert await bot.ask(CHAT, ADMIN, "/tool_on weather.delete_city destructive") == \
        "✅ weather.delete_city is on in this chat."

    assert await bot.ask(CHAT, ADMIN, "Delete Lima from the weather desk") == "Lima is gone."
    assert 'delete_city {"city": "Lima"}' in weather.calls()
    audit = await bot.query("SELECT user_id, chat_id, action, detail FROM audit_log ORDER BY id")
    assert audit[1:] == [
        (ADMIN.id, ADMIN.id, "tool_on", f"weather.delete_city scope=tg:{ADMIN.id} destructive"),
        (ADMIN.id, ADMIN.id, "tool_call", f'weather.delete_city {{"city": "Lima"}} in tg:{ADMIN.id}')]


async def test_a_wrong_header_is_refused_clearly_and_its_value_is_never_repeated(start_bot, telegram_server,
                                                                                  weather, caplog):
    watch_the_log(caplog)
    bot = await start_bot(mcp_allow_private_addresses=True)
    wrong = "wrong-header-value-5150"
    reply = await add_weather(bot, weather.url, header=f"X-Api-Key={wrong}")
    assert reply == ("❌ Could not add weather: MCP server weather is unreachable: the server answered HTTP 401: "
                     "check the headers. Nothing was saved.")
    assert await bot.query("SELECT * FROM mcp_servers") == []
    assert wrong not in everything_said(bot) and wrong not in caplog.text


# --- faults ------------------------------------------------------------------------------------------------------

async def test_a_tool_error_a_hang_and_a_huge_result_are_observations_and_the_turn_ends(start_bot, telegram_server,
                                                                                       weather):
    bot = await start_bot([act("weather.forecast", city="Atlantis"), final("Atlantis has no weather."),
                           act("weather.forecast", city="Slowtown"), final("The desk is too slow today."),
                           act("weather.forecast", city="Longville"), final("A long report.")],
                          tool_timeout_seconds=1, observation_max_chars=300, mcp_allow_private_addresses=True)
    await add_weather(bot, weather.url)
    await bot.ask(CHAT, ADMIN, "/tool_on weather.forecast")

    assert await bot.ask(CHAT, ADMIN, "Weather in Atlantis?") == "Atlantis has no weather."
    assert "Observation: Error: weather.forecast failed: Error executing tool forecast: Atlantis is not on any map" \
        in bot.llm.requests[1].last_content
    assert await bot.ask(CHAT, ADMIN, "Weather in Slowtown?") == "The desk is too slow today."
    assert "Observation: Error: weather.forecast did not finish within 1 seconds." in bot.llm.requests[3].last_content
    assert await bot.ask(CHAT, ADMIN, "Weather in Longville?") == "A long report."
    observation = bot.llm.requests[5].last_content.split("Observation: ", 1)[1]
    assert observation.startswith("Longville: very long report.")
    full = len("Longville: " + "very long report. " * 2000)  # what the server returned
    assert f"… [truncated: {full - 300} more characters]" in observation and len(observation) < 400
    assert await bot.query("SELECT error FROM steps WHERE kind = 'tool' ORDER BY id") == [
        ("tool_error",), ("timeout",), (None,)]


async def test_a_changed_schema_then_a_server_stopped_mid_turn(start_bot, telegram_server, tmp_path):
    server = await McpServerProcess.start(tmp_path)
    bot = await start_bot([act("weather.forecast", city="Paris"),
                           act("weather.forecast", city="Paris", country="France"), final("Sunny, 21°C."),
                           act("weather.forecast", city="Slowtown", country="Nowhere"), final("The desk went away."),
                           act("weather.forecast", city="Oslo", country="Norway"), final("Still down.")],
                          mcp_allow_private_addresses=True)
    try:
        await add_weather(bot, server.url, header="")
        await bot.ask(CHAT, ADMIN, "/tool_on weather.forecast")

        server.signal(signal.SIGUSR1)  # forecast now requires a country
        assert await bot.ask(CHAT, ADMIN, "Weather in Paris?") == "Sunny, 21°C."
        changed = bot.llm.requests[1].last_content
        assert "The server has changed this tool; its parameters are now:" in changed and '"country"' in changed

        killer = asyncio.create_task(kill_when_called(server, "Slowtown"))
        assert await bot.ask(CHAT, ADMIN, "Weather in Slowtown?") == "The desk went away."
        await killer
        assert '"name": "country"' in bot.llm.requests[3].text  # the next turn's prompt shows the new schema
        assert "Observation: Error: MCP server weather went away during the call" in bot.llm.requests[4].last_content

        assert await bot.ask(CHAT, ADMIN, "And Oslo?") == "Still down."
        assert "MCP server weather is unreachable: nothing answers at that address" in \
            bot.llm.requests[6].last_content
        refresh = await bot.ask(CHAT, ADMIN, "/mcp_refresh weather")
        assert refresh.startswith("❌ MCP server weather is unreachable: nothing answers at that address.")
        assert refresh.endswith("Its 2 known tool(s) stay listed; calls to them fail until it is back.")
        assert "🔴 weather" in await bot.ask(CHAT, ADMIN, "/mcp_list")
        assert await bot.query("SELECT error FROM steps WHERE kind = 'tool' ORDER BY id") == [
            ("tool_error",), (None,), ("unavailable",), ("unavailable",)]
    finally:
        server.stop()


async def kill_when_called(server: McpServerProcess, city: str) -> None:
    """Kill the server once a call for `city` is running on it."""
    await server.wait_for_call(city)
    server.kill()


async def test_start_up_never_waits_for_servers_and_stdio_ones_come_from_the_config_file(
        start_bot, telegram_server, tmp_path):
    hanging = HangingServer()
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "desk": stdio_entry(tmp_path / "stdio-calls.log"), "hangs": {"url": hanging.url},
        "gone": {"url": f"http://127.0.0.1:{free_port()}/mcp"}}}))
    try:
        bot = await start_bot([final("hello"), act("desk.forecast", city="Oslo"), final("Snow in Oslo.")],
                              mcp_config_path=str(config), mcp_connect_timeout_seconds=600)  # the file's: not checked
        assert await bot.ask(CHAT, ADMIN, "hi") == "hello"  # answered while the servers are still connecting
        hub = bot.application.bot_data["services"].mcp
        assert hub.connections["hangs"].state == "connecting"  # nobody waited for it

        await bot.server.wait_for(lambda: hub.registry.get("desk.forecast") is not None, 60, "the stdio listing")
        await bot.server.wait_for(lambda: hub.connections["gone"].state == "down", 60, "the failed connection")
        listing = await bot.ask(CHAT, ADMIN, "/mcp_list")
        assert f"🟢 desk — stdio: {sys.executable} -m tests.fakes.mcp_server stdio (config file)" in listing
        assert "🔴 gone" in listing and "down: nothing answers at that address" in listing
        assert "🟡 hangs" in listing
        assert await bot.ask(CHAT, ADMIN, "/mcp_del desk") == \
            "❌ desk is declared in the MCP config file: remove it there and restart."

        await bot.ask(CHAT, ADMIN, "/tool_on desk.forecast")
        assert await bot.ask(CHAT, ADMIN, "Oslo?") == "Snow in Oslo."
        assert "Observation: Oslo: 4°C, snow" in bot.llm.requests[2].last_content
    finally:
        hanging.close()


# --- admin mistakes ----------------------------------------------------------------------------------------------

async def test_admin_mistakes_get_clear_messages_and_change_nothing(start_bot, telegram_server):
    bot = await start_bot(mcp_allow_private_addresses=True)
    nobody = f"http://127.0.0.1:{free_port()}/mcp"
    cases = [
        ("/mcp_list", "No MCP servers yet."),
        ("/mcp_add", "❌ a name and a URL are needed\nUsage: /mcp_add NAME URL [Header=value …]"),
        ("/mcp_add wiki", "❌ a name and a URL are needed"),
        ("/mcp_add Wiki! http://127.0.0.1:1/mcp", "❌ server name 'Wiki!' must be 1-32 characters"),
        ("/mcp_add wiki ftp://127.0.0.1/mcp", "❌ 'ftp://127.0.0.1/mcp' is not an http:// or https:// URL"),
        ("/mcp_add wiki http://127.0.0.1:1/mcp Authorization", "❌ headers are written Name=value"),
        ('/mcp_add wiki http://127.0.0.1:1/mcp "X-Key=abc', "❌ No closing quotation"),
        (f"/mcp_add wiki {nobody}", "❌ Could not add wiki: MCP server wiki is unreachable: nothing answers at that "
                                    "address. Nothing was saved."),
        ("/mcp_del", "Usage: /mcp_del NAME"),
        ("/mcp_del wiki", "❌ No MCP server named 'wiki'. See /mcp_list."),
        ("/mcp_refresh", "Usage: /mcp_refresh NAME"),
        ("/mcp_refresh wiki", "❌ No MCP server named 'wiki'. See /mcp_list."),
        ("/tool_off calculator destructive", "Usage: /tool_off NAME [global]"),
        ("/tool_on calculator global global", "Usage: /tool_on NAME [global] [destructive]"),
    ]
    for command, expected in cases:
        reply = await bot.ask(CHAT, ADMIN, command)
        assert reply.startswith(expected), (command, reply)
        assert "Traceback" not in reply
    for table in ("mcp_servers", "mcp_tools", "tool_settings", "audit_log"):
        assert await bot.query(f"SELECT * FROM {table}") == [], table
