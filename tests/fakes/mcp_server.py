"""A real MCP server, written with the official SDK, for the MCP tests: a team's "weather desk".

    python -m tests.fakes.mcp_server streamable-http PORT [REQUIRED_HEADER=VALUE]
    python -m tests.fakes.mcp_server sse PORT
    python -m tests.fakes.mcp_server stdio

Two tools, as a real server would annotate them:

- `forecast(city)`: read-only. A few cities answer at once; `Atlantis` fails with a tool error; `Slowtown` never
  answers (the time limit and "stopped mid-call" tests); `Longville` returns a very long text.
- `delete_city(city)`: destructive. Removes a city, for the safety tests.

SIGUSR1 changes `forecast`'s schema: from then on it requires `country` too, and refuses calls without it (the
"schema changed" test). SIGUSR2 drops `forecast`'s read-only hint, as a careless server update would. With
REQUIRED_HEADER the HTTP server refuses every request lacking that header (401). With MCP_FAKE_CALL_LOG set, every
call is appended to that file as `tool {"arguments": ...}` before it runs, so tests see what reached the server.

MCP_FAKE_EXTRAS (comma-separated) makes the desk misbehave as the security probes need:

- `echo_headers`: a read-only `echo_headers()` tool returning the HTTP headers of the request, as a debugging
  tool of a real server would (a secret header then comes back in a tool result).
- `tools=N`: N more read-only tools, `extra_1` … `extra_N` (a server offering more than the bot takes).
- `duplicate`: the listing names `forecast` twice (a broken server; the second copy has another description).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import Tool, ToolAnnotations

WEATHER = {"Paris": "Paris: 21°C, sunny", "Oslo": "Oslo: 4°C, snow", "Lima": "Lima: 18°C, fog"}
READ_ONLY = ToolAnnotations(read_only_hint=True)
DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True)

EXTRAS = [word.strip() for word in os.environ.get("MCP_FAKE_EXTRAS", "").split(",") if word.strip()]


class WeatherDesk(MCPServer):
    """The SDK's server, with a listing that can name a tool twice (MCP_FAKE_EXTRAS=duplicate)."""

    async def list_tools(self) -> list[Tool]:
        tools = await super().list_tools()
        if "duplicate" in EXTRAS:
            first = next(tool for tool in tools if tool.name == "forecast")
            tools.append(first.model_copy(update={"description": "A second forecast, listed under the same name."}))
        return tools


server = WeatherDesk("weather-desk", instructions="Weather for a few cities.")


def log_call(tool: str, **arguments: str) -> None:
    """Note the call in MCP_FAKE_CALL_LOG, if set."""
    if path := os.environ.get("MCP_FAKE_CALL_LOG"):
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{tool} {json.dumps(arguments, ensure_ascii=False, sort_keys=True)}\n")


async def weather_in(city: str) -> str:
    """The report, or the behaviour a test asked for by naming its city."""
    if city == "Atlantis":
        raise ToolError("Atlantis is not on any map")
    if city == "Slowtown":
        await asyncio.sleep(3600)
    if city == "Longville":
        return "Longville: " + "very long report. " * 2000
    return WEATHER.get(city, f"{city}: no data")


async def forecast(city: str) -> str:
    """Today's weather in a city."""
    log_call("forecast", city=city)
    return await weather_in(city)


async def forecast_v2(city: str, country: str) -> str:
    """Today's weather in a city of a country (the country is now required)."""
    log_call("forecast", city=city, country=country)
    return f"{await weather_in(city)} ({country})"


async def delete_city(city: str) -> str:
    """Remove a city from the weather desk, for good."""
    log_call("delete_city", city=city)
    return f"deleted {city}" if WEATHER.pop(city, None) else f"no city {city}"


def change_schema(*_: object) -> None:
    """SIGUSR1: `forecast` now requires a country."""
    server.remove_tool("forecast")
    server.add_tool(forecast_v2, name="forecast", annotations=READ_ONLY)


def drop_read_only_hint(*_: object) -> None:
    """SIGUSR2: `forecast` loses its annotations (so, by MCP's defaults, it may now change data)."""
    server.remove_tool("forecast")
    server.add_tool(forecast)


async def echo_headers(ctx: Context) -> str:
    """The HTTP headers of this request, for debugging."""
    return json.dumps(dict(ctx.headers or {}), sort_keys=True)


def add_extra_tools(count: int) -> None:
    """`extra_1` … `extra_COUNT`, all read-only."""
    for number in range(1, count + 1):
        async def extra(number: int = number) -> str:
            return f"extra {number}"
        server.add_tool(extra, name=f"extra_{number}", description=f"Extra tool number {number}.",
                        annotations=READ_ONLY)


server.add_tool(forecast, annotations=READ_ONLY)
server.add_tool(delete_city, annotations=DESTRUCTIVE)
if "echo_headers" in EXTRAS:
    server.add_tool(echo_headers, annotations=READ_ONLY)
for extra in EXTRAS:
    if extra.startswith("tools="):
        add_extra_tools(int(extra.partition("=")[2]))


def require_header(app, name: str, value: str):
    """An ASGI wrapper refusing HTTP requests without the header, as an API gateway in front of a server would."""
    wanted = (name.lower().encode(), value.encode())

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and wanted not in scope.get("headers", []):
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing or wrong credentials"})
            return
        await app(scope, receive, send)
    return guarded


def serve_http(port: int, header: str | None) -> None:
    """Streamable HTTP at /mcp, behind the header check when one is given."""
    import uvicorn

    app = server.streamable_http_app(host="127.0.0.1")
    if header:
        name, _, value = header.partition("=")
        app = require_header(app, name, value)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def main(argv: list[str]) -> None:
    """Serve over the transport named in `argv`."""
    signal.signal(signal.SIGUSR1, change_schema)
    signal.signal(signal.SIGUSR2, drop_read_only_hint)
    transport = argv[0]
    if transport == "stdio":
        server.run("stdio")
    elif transport == "sse":
        server.run("sse", host="127.0.0.1", port=int(argv[1]))
    else:
        serve_http(int(argv[1]), argv[2] if len(argv) > 2 else None)


if __name__ == "__main__":
    main(sys.argv[1:])
