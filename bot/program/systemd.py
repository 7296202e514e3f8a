"""systemd's notify protocol (`Type=notify`, `WatchdogSec=`): ready once serving, and a watchdog ping only while
the health checks pass, so that systemd restarts a bot that is alive but stuck.

The protocol is one datagram to the socket in `NOTIFY_SOCKET` (sd_notify(3)); outside systemd nothing is sent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Callable

from bot.program.health import HealthReport

log = logging.getLogger(__name__)


def notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1") to systemd; False when not run by systemd (or it could not be sent)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as error:
        log.warning("cannot notify systemd (%s): %s", state.split("=")[0], error)
        return False
    return True


def watchdog_seconds() -> float | None:
    """The watchdog interval systemd asks for (`WatchdogSec=` → WATCHDOG_USEC), if it asks this process."""
    usec, pid = os.environ.get("WATCHDOG_USEC"), os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 1_000_000
    except ValueError:
        return None


async def watchdog(check: Callable[[], HealthReport], every: float) -> None:
    """Ping systemd's watchdog every `every` seconds while `check` passes; a failing check pings nothing, so
    systemd restarts the bot once WatchdogSec runs out. Runs until cancelled."""
    while True:
        report = await asyncio.to_thread(check)
        if report.ok:
            notify("WATCHDOG=1")
        else:
            failing = "; ".join(f"{f.name}: {f.detail}" for f in report.findings if not f.ok)
            log.warning("unhealthy, not pinging the watchdog: %s", failing)
            notify(f"STATUS=unhealthy: {failing}"[:200])
        await asyncio.sleep(every)
