"""The fake MCP server (tests/fakes/mcp_server.py) as a real process on 127.0.0.1, or as a stdio command line.

    server = await McpServerProcess.start(tmp_path, header="X-Api-Key=s3cret")
    server.url            # http://127.0.0.1:PORT/mcp
    server.calls()        # what reached the server: ["forecast {\"city\": \"Paris\"}", ...]
    server.kill()         # gone, mid-call if need be
    server.stop()
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SERVER_MODULE = "tests.fakes.mcp_server"


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stdio_entry(call_log: Path) -> dict:
    """The fake server as an `mcpServers` stdio entry of a config file."""
    return {"command": sys.executable, "args": ["-m", SERVER_MODULE, "stdio"], "cwd": str(ROOT),
            "env": {"MCP_FAKE_CALL_LOG": str(call_log), "PYTHONPATH": str(ROOT)}}


@dataclass
class McpServerProcess:
    """A fake MCP server serving over HTTP in a child process."""

    process: subprocess.Popen
    port: int
    call_log: Path
    path: str = "/mcp"

    @classmethod
    async def start(cls, folder: Path, **options: Any) -> "McpServerProcess":
        """Start the server and wait, off the event loop, until it accepts connections."""
        return await asyncio.to_thread(cls.launch, folder, **options)

    @classmethod
    def launch(cls, folder: Path, *, transport: str = "streamable-http", header: str | None = None,
               port: int | None = None, extras: str = "") -> "McpServerProcess":
        """Start the server and wait until it accepts connections; `extras` is MCP_FAKE_EXTRAS (mcp_server.py)."""
        port = port or free_port()
        call_log = folder / f"mcp-calls-{port}.log"
        command = [sys.executable, "-m", SERVER_MODULE, transport, str(port), *([header] if header else [])]
        env = {**os.environ, "MCP_FAKE_CALL_LOG": str(call_log), "PYTHONPATH": str(ROOT), "MCP_FAKE_EXTRAS": extras}
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        server = cls(process, port, call_log, "/sse" if transport == "sse" else "/mcp")
        server._wait_until_listening()
        return server

    @property
    def url(self) -> str:
        """The endpoint to connect to."""
        return f"http://127.0.0.1:{self.port}{self.path}"

    def calls(self) -> list[str]:
        """Every tool call that reached the server, in order."""
        return self.call_log.read_text(encoding="utf-8").splitlines() if self.call_log.exists() else []

    async def wait_for_call(self, text: str, timeout: float = 30.0) -> None:
        """Wait until a call containing `text` has reached the server (and is running there)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not any(text in call for call in self.calls()):
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no call with {text!r} reached the server; calls: {self.calls()}")
            await asyncio.sleep(0.02)

    def signal(self, signum: int) -> None:
        """Send a signal (SIGUSR1: forecast's schema changes; SIGUSR2: forecast loses its read-only hint)."""
        self.process.send_signal(signum)

    def kill(self) -> None:
        """Kill the server at once, as a crash would."""
        self.process.kill()
        self.process.wait(timeout=30)

    def stop(self) -> None:
        """Stop the server if it still runs (no grace: nothing of it is kept)."""
        if self.process.poll() is None:
            self.kill()

    def _wait_until_listening(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("the fake MCP server did not start listening")
            time.sleep(0.05)
        raise RuntimeError(f"the fake MCP server exited with status {self.process.returncode}")


class HangingServer:
    """A TCP listener that accepts connections and never answers: a server that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)

    @property
    def url(self) -> str:
        """An MCP endpoint on it."""
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/mcp"

    def close(self) -> None:
        """Stop listening."""
        self.sock.close()
