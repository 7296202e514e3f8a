"""MCP servers as a tool source, below Telegram: a real server written with the SDK (over streamable HTTP, SSE and
stdio), the hub, the registry and the tool settings on a real database file.

The shared server requires the header X-Api-Key; tests that kill or change a server start their own.
"""

from __future__ import annotations

import asyncio
import json
import signal

import mcp_types
import pytest

from db import open_database
from tests.fakes.mcp_process import HangingServer, McpServerProcess, free_port, stdio_entry
from tools import build_registry
from tools.errors import ConfirmationNeeded, McpConfigError, ServerUnavailable
from tools.mcp import McpHub, McpLimits, result_text
from tools.mcp_store import ServerSpec, public_url, read_config, url_server
from tools.settings import GLOBAL, ToolSettings

SECRET = "s3cret-value-4711"
HEADER = {"X-Api-Key": SECRET}
# Generous: on a loaded 2-core machine a Python MCP server takes seconds to start. Nothing here waits for them
# unless it has to.
# The fake servers listen on 127.0.0.1: a loopback address, which admin-added servers may use only when allowed.
LIMITS = McpLimits(connect_timeout_seconds=60, retry_seconds=0, allow_private_addresses=True)


@pytest.fixture(scope="module")
def weather(tmp_path_factory):
    """The shared weather desk over streamable HTTP, behind the X-Api-Key header."""
    server = McpServerProcess.launch(tmp_path_factory.mktemp("mcp"), header=f"X-Api-Key={SECRET}")
    yield server
    server.stop()


@pytest.fixture
async def hub(db):
    """A hub on the test's database, closed after the test."""
    hubs: list[McpHub] = []

    async def make(config=(), limits: McpLimits = LIMITS, timeout: float = 30.0, connect: bool = True) -> McpHub:
        made = McpHub(db, build_registry(db, timeout), config=list(config), limits=limits)
        await made.start(connect=connect)
        hubs.append(made)
        return made

    yield make
    for made in hubs:
        await made.close()


def spec(url: str, name: str = "weather", headers=HEADER) -> ServerSpec:
    return url_server(name, url, headers)


async def rows(db, sql: str) -> list[tuple]:
    return [tuple(row) for row in await db.fetchall(sql)]


async def background_listing(made: McpHub) -> None:
    """Wait for the listings `start` began."""
    for task in made._background:
        await task


# --- listing ---------------------------------------------------------------------------------------------------

async def test_a_server_is_listed_stored_and_registered_with_every_tool_off(hub, db, weather):
    made = await hub()
    listing = await made.add(spec(weather.url), added_by=42)

    assert [(t.name, t.access) for t in listing.tools] == [("forecast", "read-only"), ("delete_city", "destructive")]
    forecast = made.registry.get("weather.forecast")
    assert forecast.parameters["required"] == ["city"] and forecast.source == "mcp:weather"
    assert forecast.description == "Today's weather in a city." and forecast.read_only
    assert not made.registry.get("weather.delete_city").read_only
    states = await ToolSettings(db, made.registry).states("tg:1")
    assert [(s.tool.name, s.enabled, s.source) for s in states if s.tool.source != "built-in"] == [
        ("weather.forecast", False, "default"), ("weather.delete_city", False, "default")]
    # The header's value is sealed with the key beside the database (migration 0013); the plain columns show names.
    assert await rows(db, "SELECT name, transport, url, headers, added_by FROM mcp_servers") == [
        ("weather", "http", weather.url, json.dumps({name: "" for name in HEADER}), 42)]
    [(sealed,)] = await rows(db, "SELECT sealed FROM mcp_servers")
    assert json.loads(made.box.open(sealed)) == {"url": weather.url, "headers": HEADER}
    assert await rows(db, "SELECT server, name, read_only, destructive FROM mcp_tools ORDER BY rowid") == [
        ("weather", "forecast", 1, 0), ("weather", "delete_city", 0, 1)]


async def test_calls_return_the_text_and_every_failure_is_an_observation(hub, weather):
    made = await hub(timeout=2)
    await made.add(spec(weather.url), added_by=None)
    registry = made.registry

    ok = await registry.call("weather.forecast", {"city": "Paris"})
    assert (ok.output, ok.error) == ("Paris: 21°C, sunny", None)
    failed = await registry.call("weather.forecast", {"city": "Atlantis"})
    assert failed.error == "tool_error" and "Atlantis is not on any map" in failed.output
    before = weather.calls()
    wrong = await registry.call("weather.forecast", {"town": "Oslo"})
    assert wrong.error == "invalid_arguments" and "'city' is a required property" in wrong.output
    assert weather.calls() == before  # refused here, never sent
    hung = await registry.call("weather.forecast", {"city": "Slowtown"})
    assert hung.error == "timeout" and "did not finish within 2 seconds" in hung.output
    again = await registry.call("weather.forecast", {"city": "Lima"})
    assert again.output == "Lima: 18°C, fog"  # the session outlives a call that timed out


async def test_a_missing_header_is_a_clear_refusal_and_nothing_is_saved(hub, db, weather):
    made = await hub()
    with pytest.raises(ServerUnavailable) as refused:
        await made.add(spec(weather.url, headers={"X-Api-Key": "wrong-value-1234"}), added_by=None)
    assert "HTTP 401: check the headers" in str(refused.value) and "wrong-value" not in str(refused.value)
    assert await rows(db, "SELECT * FROM mcp_servers") == [] and "weather" not in made.connections
    assert made.registry.from_source("mcp:weather") == []


async def test_nothing_listening_and_a_server_that_hangs_are_refused_in_time(hub, db):
    hanging = HangingServer()
    made = await hub(limits=McpLimits(connect_timeout_seconds=1, retry_seconds=0, allow_private_addresses=True))
    try:
        with pytest.raises(ServerUnavailable, match="nothing answers at that address"):
            await made.add(spec(f"http://127.0.0.1:{free_port()}/mcp", name="nobody"), added_by=None)
        with pytest.raises(ServerUnavailable, match="no answer within 1 s"):
            await made.add(spec(hanging.url, name="hangs"), added_by=None)
    finally:
        hanging.close()
    assert await rows(db, "SELECT * FROM mcp_servers") == []


async def test_a_name_is_taken_once(hub, weather):
    made = await hub()
    await made.add(spec(weather.url), added_by=None)
    with pytest.raises(McpConfigError, match="exists already"):
        await made.add(spec(weather.url), added_by=None)


# --- the config file: stdio and SSE ------------------------------------------------------------------------------

async def test_servers_from_the_config_file_over_stdio_and_sse(hub, tmp_path):
    sse = await McpServerProcess.start(tmp_path, transport="sse")
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"desk": stdio_entry(tmp_path / "stdio-calls.log"),
                                                 "old": {"url": sse.url, "type": "sse"}}}))
    try:
        made = await hub(read_config(config))
        assert made.registry.from_source("mcp:desk") == []  # start() does not wait for the servers
        await background_listing(made)
        assert [t.name for t in made.registry.from_source("mcp:desk")] == ["desk.forecast", "desk.delete_city"]
        assert (await made.registry.call("desk.forecast", {"city": "Oslo"})).output == "Oslo: 4°C, snow"
        assert (await made.registry.call("old.forecast", {"city": "Lima"})).output == "Lima: 18°C, fog"
        assert (tmp_path / "stdio-calls.log").read_text().splitlines() == ['forecast {"city": "Oslo"}']
        with pytest.raises(McpConfigError, match="declared in the MCP config file"):
            await made.remove("desk")
    finally:
        sse.stop()


@pytest.mark.parametrize("content, says", [
    ("{not json", "cannot read MCP_CONFIG_PATH"),
    ('{"servers": {}}', 'must hold a JSON object {"mcpServers"'),
    ('{"mcpServers": {"Bad Name": {"command": "x"}}}', "server name 'Bad Name' must be"),
    ('{"mcpServers": {"x": {"args": ["a"]}}}', "server 'x': needs a \"command\" (stdio) or a \"url\""),
    ('{"mcpServers": {"x": {"command": "run", "args": "a b"}}}', '"args" must be a list of strings'),
    ('{"mcpServers": {"x": {"url": "ftp://host/mcp"}}}', "is not an http:// or https:// URL"),
])
def test_a_broken_config_file_is_one_clear_error(tmp_path, content, says):
    path = tmp_path / "mcp.json"
    path.write_text(content)
    with pytest.raises(McpConfigError) as caught:
        read_config(path)
    assert says in str(caught.value) and str(path) in str(caught.value)


def test_no_config_file_means_no_servers():
    assert read_config("") == [] and read_config(None) == []


# --- down, gone, changed ---------------------------------------------------------------------------------------

async def test_a_server_killed_mid_call_then_down_at_start_then_back(hub, tmp_path):
    server = await McpServerProcess.start(tmp_path)
    first = await hub()
    await first.add(spec(server.url, headers={}), added_by=None)
    call = asyncio.create_task(first.registry.call("weather.forecast", {"city": "Slowtown"}))
    await server.wait_for_call("Slowtown")
    server.kill()
    result = await call
    assert result.error == "unavailable" and "MCP server weather went away during the call" in result.output
    await first.close()

    made = await hub()  # the listing in the background fails; the cached tools are offered meanwhile
    assert [t.name for t in made.registry.from_source("mcp:weather")] == ["weather.forecast", "weather.delete_city"]
    result = await made.registry.call("weather.forecast", {"city": "Paris"})
    assert result.error == "unavailable"
    assert "MCP server weather is unreachable: nothing answers at that address" in result.output
    await background_listing(made)
    assert made.connections["weather"].state == "down"

    back = await McpServerProcess.start(tmp_path, port=server.port)
    try:  # RETRY_SECONDS is 0 here: the next call connects again
        assert (await made.registry.call("weather.forecast", {"city": "Oslo"})).output == "Oslo: 4°C, snow"
        assert made.connections["weather"].state == "connected"
    finally:
        back.stop()


async def test_a_changed_schema_is_explained_and_a_lost_read_only_hint_turns_the_tool_off(hub, db, tmp_path):
    server = await McpServerProcess.start(tmp_path)
    try:
        made = await hub()
        await made.add(spec(server.url, headers={}), added_by=None)
        tool_settings = ToolSettings(db, made.registry)
        await tool_settings.set_enabled("weather.forecast", True, "tg:1")
        with pytest.raises(ConfirmationNeeded):
            await tool_settings.set_enabled("weather.delete_city", True, GLOBAL)

        server.signal(signal.SIGUSR1)  # forecast now requires a country
        result = await made.registry.call("weather.forecast", {"city": "Paris"})
        assert result.error == "tool_error" and "weather.forecast failed:" in result.output
        assert "The server has changed this tool; its parameters are now:" in result.output
        assert '"name": "country"' in result.output
        assert made.registry.get("weather.forecast").parameters["required"] == ["city", "country"]
        assert "country" in (await rows(db, "SELECT input_schema FROM mcp_tools WHERE name = 'forecast'"))[0][0]
        fixed = await made.registry.call("weather.forecast", {"city": "Paris", "country": "France"})
        assert fixed.output == "Paris: 21°C, sunny (France)"
        assert [t.name for t in await tool_settings.enabled_tools("tg:1")][-1] == "weather.forecast"

        server.signal(signal.SIGUSR2)  # forecast loses its read-only hint
        listing = await made.refresh("weather")
        assert listing.changed == ["forecast"] and listing.reset == ["weather.forecast"]
        assert all(t.source == "built-in" for t in await tool_settings.enabled_tools("tg:1"))
        with pytest.raises(ConfirmationNeeded):
            await tool_settings.set_enabled("weather.forecast", True, "tg:1")
        await tool_settings.set_enabled("weather.forecast", True, "tg:1", confirmed=True)
    finally:
        server.stop()


async def test_remove_forgets_the_server_its_listing_and_its_settings(hub, db, weather):
    made = await hub()
    await made.add(spec(weather.url), added_by=None)
    await ToolSettings(db, made.registry).set_enabled("weather.forecast", True, GLOBAL)
    assert await made.remove("weather") == ["weather.forecast", "weather.delete_city"]
    assert made.registry.from_source("mcp:weather") == []
    for table in ("mcp_servers", "mcp_tools", "tool_settings"):
        assert await rows(db, f"SELECT * FROM {table}") == [], table
    with pytest.raises(KeyError):
        await made.remove("weather")


async def test_a_server_added_from_the_terminal_is_loaded_by_refresh(hub, db, db_path, weather):
    running = await hub()
    other = await open_database(db_path)  # `qwenbot mcp add`, as another process would
    try:
        terminal = McpHub(other, build_registry(other), limits=LIMITS)
        await terminal.start(connect=False)
        await terminal.add(spec(weather.url), added_by=None)
        await terminal.close()
    finally:
        await other.close()
    assert running.registry.get("weather.forecast") is None
    await running.refresh("weather")
    assert running.registry.get("weather.forecast") is not None


# --- secrets and results -----------------------------------------------------------------------------------------

def test_header_values_and_url_credentials_are_never_shown():
    server = url_server("wiki", "https://bot:pa55word@wiki.example:8443/mcp?token=abc123&v=2",
                        {"Authorization": "Bearer abc123"})
    for text in (repr(server), server.where, public_url(server.url)):
        assert "abc123" not in text and "pa55word" not in text, text
    assert server.where == ("streamable HTTP https://wiki.example:8443/mcp?token=***&v=***, headers Authorization "
                            "(values hidden)")
    assert url_server("old", "http://127.0.0.1:9/sse", {}).transport == "sse"


def test_results_become_text_and_other_content_is_named_not_shown():
    result = mcp_types.CallToolResult(content=[
        mcp_types.TextContent(text="first"),
        mcp_types.ImageContent(data="aGVsbG8=", mime_type="image/png"),
        mcp_types.ResourceLink(name="report", uri="file:///r.txt"),
    ])
    assert result_text(result) == "first\n[image: image/png, not shown]\n[resource report: file:///r.txt]"
    assert result_text(mcp_types.CallToolResult(content=[], structured_content={"n": 1})) == '{"n": 1}'
    assert result_text(mcp_types.CallToolResult(content=[])) == "(the tool returned nothing)"


def test_unusable_tools_are_skipped_with_a_reason():
    from tools.mcp import tool_info, usable_tools

    listed = [mcp_types.Tool(name="good", input_schema={"type": "object", "properties": {}}),
              mcp_types.Tool(name="has space", input_schema={"type": "object"}),
              mcp_types.Tool(name="bad_schema", input_schema={"type": "object", "properties": {"x": {"type": 5}}})]
    tools, skipped = usable_tools("srv", [tool_info(t, 100) for t in listed], lambda *a, **k: None)
    assert [t.name for t in tools] == ["srv.good"]
    assert skipped[0].startswith("has space: the name has characters")
    assert skipped[1].startswith("bad_schema: its input schema is not valid JSON Schema")
    assert not tools[0].read_only and tools[0].destructive  # no annotations: MCP's defaults, so it may change data

