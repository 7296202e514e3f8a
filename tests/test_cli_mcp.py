"""`qwenbot mcp list|add|del` and `qwenbot tools` with MCP tools, as real processes against a real MCP server."""

from __future__ import annotations

import pytest

from tests.fakes.mcp_process import McpServerProcess, free_port
from tests.test_cli_foundation import qwenbot

SECRET = "cli-secret-value-2718"


@pytest.fixture(scope="module")
def weather(tmp_path_factory):
    """The weather desk over streamable HTTP, behind the X-Api-Key header."""
    server = McpServerProcess.launch(tmp_path_factory.mktemp("mcp"), header=f"X-Api-Key={SECRET}")
    yield server
    server.stop()


def test_add_list_tools_and_del_mirror_the_admin_commands(tmp_path, weather):
    env = {"DATABASE_PATH": str(tmp_path / "bot.sqlite3"), "MCP_ALLOW_PRIVATE_ADDRESSES": "true"}
    added = qwenbot("mcp", "add", "weather", weather.url, f"X-Api-Key={SECRET}", **env)
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith(f"✅ Added weather (streamable HTTP {weather.url}, headers X-Api-Key (values "
                                   "hidden)).\n2 tools:\n• weather.forecast — read-only\n")

    tools = qwenbot("tools", **env).stdout.splitlines()
    assert [line.split() for line in tools[-2:]] == [
        ["off", "weather.forecast", "mcp:weather", "read-only", "forecast", "(default)"],
        ["off", "weather.delete_city", "mcp:weather", "destructive", "delete_city", "(default)"]]
    assert tools[0].split()[:4] == ["on", "course_query", "built-in", "read-only"]

    listing = qwenbot("mcp", "list", **env).stdout
    assert listing.splitlines() == [
        f"⚪ weather — streamable HTTP {weather.url}, headers X-Api-Key (values hidden) (database)",
        "2 tool(s): forecast (read-only), delete_city (destructive)"]

    again = qwenbot("mcp", "add", "weather", weather.url, **env)
    assert (again.returncode, again.stderr) == (2, "qwenbot: a server named weather exists already\n")
    removed = qwenbot("mcp", "del", "weather", **env)
    assert removed.stdout == "Removed weather and its tools (weather.forecast, weather.delete_city).\n"
    gone = qwenbot("mcp", "del", "weather", **env)
    assert (gone.returncode, gone.stderr) == (2, "qwenbot: no MCP server named 'weather' in the database\n")
    for result in (added, removed, again, gone):
        assert SECRET not in result.stdout + result.stderr
    assert SECRET not in listing


def test_failures_are_one_line_with_exit_status_2(tmp_path):
    env = {"DATABASE_PATH": str(tmp_path / "bot.sqlite3"), "MCP_ALLOW_PRIVATE_ADDRESSES": "true"}
    nobody = qwenbot("mcp", "add", "wiki", f"http://127.0.0.1:{free_port()}/mcp", **env)
    assert (nobody.returncode, nobody.stderr) == (
        2, "qwenbot: MCP server wiki is unreachable: nothing answers at that address\n")
    config = tmp_path / "mcp.json"
    config.write_text('{"mcpServers": {"desk": {}}}')
    broken = qwenbot("tools", MCP_CONFIG_PATH=str(config), **env)
    assert (broken.returncode, broken.stderr) == (
        2, f"qwenbot: {config}: server 'desk': needs a \"command\" (stdio) or a \"url\"\n")
