"""Addresses as an operator writes them: ``HOST:PORT`` (where to listen) and
``HOST:PORT:AGENT_PORT`` (a node: its HTTP port and the port of its load agent).

HOST is a DNS name, an IPv4 address, or an IPv6 address in brackets (``[::1]:8000``). The
checks are strict because the text ends up in a configuration file: a host with a space or a
newline in it would write configuration of its own. Every refusal is a :class:`ValueError`
whose message names the flag, repeats the bad value and says what was expected.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

_DNS_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?")
_DIGITS_AND_DOTS = re.compile(r"[0-9.]+")


@dataclass(frozen=True)
class Address:
    """A host and a TCP port (1-65535). ``str()`` writes it back as ``HOST:PORT``, an IPv6
    host in brackets, which is also how HAProxy reads it."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class Node:
    """One cadenza server: where it serves HTTP, and the TCP port its load agent answers on
    (a line such as ``up 37%``, ``drain`` or ``down`` per connection)."""

    address: Address
    agent_port: int

    def __str__(self) -> str:
        return f"{self.address}:{self.agent_port}"


def parse_address(text: str, flag: str) -> Address:
    """``HOST:PORT`` given to ``flag`` (``"--listen"``, ``"--stats"``) as an :class:`Address`."""
    host, ports = _split(text, flag, ("PORT",))
    return Address(host, ports[0])


def parse_node(text: str, flag: str = "--node") -> Node:
    """``HOST:PORT:AGENT_PORT`` as a :class:`Node`; the two ports must differ."""
    host, (port, agent_port) = _split(text, flag, ("PORT", "AGENT_PORT"))
    if port == agent_port:
        raise ValueError(f"{flag} {text!r}: AGENT_PORT must differ from PORT (both {port})")
    return Node(Address(host, port), agent_port)


def _split(text: str, flag: str, port_names: tuple[str, ...]) -> tuple[str, list[int]]:
    """The host and the ports of ``text``, each checked."""
    shape = ":".join(("HOST", *port_names))
    example = ":".join(("10.0.0.5", "8000", "8001")[: 1 + len(port_names)])
    expected = f"expected {shape}, e.g. {example} (an IPv6 host in brackets: [::1])"
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"{flag} {text!r}: {expected}")
        fields = rest[1:].split(":") if rest else []
    else:
        host, *fields = text.split(":")
    if len(fields) != len(port_names):
        missing = port_names[len(fields) :]
        why = f"{', '.join(missing)} missing" if missing else "too many ':'"
        raise ValueError(f"{flag} {text!r}: {why}; {expected}")
    _check_host(host, text, flag, bracketed=text.startswith("["))
    return host, [
        _port(field, name, text, flag) for field, name in zip(fields, port_names, strict=True)
    ]


def _check_host(host: str, text: str, flag: str, *, bracketed: bool) -> None:
    if not host:
        raise ValueError(f"{flag} {text!r}: HOST is empty")
    if bracketed:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(
                f"{flag} {text!r}: {host!r} in brackets is not an IPv6 address"
            ) from None
        return
    if _DIGITS_AND_DOTS.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: {host!r} is not an IPv4 address") from None
        return
    if not _DNS_NAME.fullmatch(host):
        raise ValueError(
            f"{flag} {text!r}: HOST {host!r} is not a DNS name or an IP address "
            "(letters, digits, '.', '-'; an IPv6 address goes in brackets)"
        )


def _port(field: str, name: str, text: str, flag: str) -> int:
    if not field.isascii() or not field.isdigit() or not 1 <= int(field) <= 65535:
        raise ValueError(f"{flag} {text!r}: {name} must be a number from 1 to 65535, not {field!r}")
    return int(field)
