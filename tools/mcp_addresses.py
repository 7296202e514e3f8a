"""Where an admin-added MCP server may be: public addresses only, unless MCP_ALLOW_PRIVATE_ADDRESSES says otherwise.

An admin's `/mcp_add` makes the bot send HTTP requests to a URL of the admin's choosing, from inside the host's
network, with the bot's own reach: the Bot API server (the token in its path), the model server, an admin panel on
127.0.0.1, a cloud metadata service on 169.254.169.254. That is server-side request forgery, the way most careful
fetchers treat it (browsers' Private Network Access, cloud SDKs, webhook senders such as GitHub's): the host is
resolved, and every address it resolves to must be a public (globally routable) one. Loopback, private (10/8,
172.16/12, 192.168/16, fc00::/7), link-local, carrier-grade NAT, multicast, reserved and unspecified addresses are
refused, IPv4 written inside IPv6 included. A team whose MCP servers run on its own network says so once:
MCP_ALLOW_PRIVATE_ADDRESSES=true. Servers in the config file (MCP_CONFIG_PATH) are declared by whoever runs the
host, who can reach those addresses anyway, and are not checked.

The check runs before every connection (each reconnect resolves again); a name that resolves elsewhere between the
check and the connection (DNS rebinding within milliseconds) is the residual risk SECURITY.md names.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from tools.errors import PrivateAddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def is_public(address: IPAddress) -> bool:
    """Whether `address` is globally routable (an IPv4 address inside IPv6 is judged as itself)."""
    address = unwrapped(address)
    return address.is_global and not address.is_multicast


def unwrapped(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo), or the address itself."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour or (address.teredo[1] if address.teredo else None)
        if inner is not None:
            return inner
    return address


async def resolved_addresses(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to now (a literal address is itself); [] when it does not resolve."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return []  # the connection fails on its own, with its own clear message
    return [ipaddress.ip_address(info[4][0].partition("%")[0]) for info in infos]


async def check_public_url(url: str) -> None:
    """Refuse (PrivateAddress) a URL whose host resolves to any address that is not public."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    for address in await resolved_addresses(host, port):
        if not is_public(address):
            shown = host if host == str(address) else f"{host} ({address})"
            raise PrivateAddress(f"{shown} is a {kind_of(address)} address; MCP servers must be on public addresses "
                                 "unless MCP_ALLOW_PRIVATE_ADDRESSES=true")


def kind_of(address: IPAddress) -> str:
    """What kind of non-public address this is, in a word or two."""
    address = unwrapped(address)
    for label, flag in (("loopback", "is_loopback"), ("link-local", "is_link_local"), ("multicast", "is_multicast"),
                        ("unspecified", "is_unspecified"), ("private", "is_private"), ("reserved", "is_reserved")):
        if getattr(address, flag):
            return label
    return "non-public"
