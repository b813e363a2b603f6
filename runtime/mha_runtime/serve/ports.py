"""Free ports for the servers `mha serve` starts (HAProxy's stats, metrics and fallback ports) and for the test and
bench harness's servers: drawn between Ray's worker ports and the kernel's ephemeral range, never twice in a process.
And the one look at a Ray cluster's address before Ray is given it.

Ports the kernel hands out by itself (every outgoing connection, every bind to port 0 of Ray's processes) come
from the ephemeral range, so a port picked there by binding port 0 could be taken before its server binds it, as
Serve's proxy once found ("Failed to bind to address"). A server still fails cleanly if a port is taken between
the probe and its bind.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path

from mha_runtime.artifact.errors import ServeError

# Ray's workers listen on 10002-19999 by default (ray start --min/--max-worker-port).
ABOVE_RAY_WORKERS = 20000
_handed_out: set[int] = set()  # two servers of one process never get the same port before either binds it


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (ip_local_port_range; Linux's default 32768)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at `host` right now ("" = every interface), below the ephemeral range."""
    low = _ephemeral_low()
    draw = random.SystemRandom()
    for _ in range(200 if low > ABOVE_RAY_WORKERS else 0):
        port = draw.randrange(ABOVE_RAY_WORKERS, low)
        if port in _handed_out:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as probe:  # no room below the ephemeral range on this host
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def split_address(address: str) -> tuple[str, int]:
    """HOST and PORT of a Ray cluster's address as ray.init takes it: HOST:PORT, [IPv6]:PORT or ray://HOST:PORT."""
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not colon or not host or not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"expected auto, HOST:PORT or ray://HOST:PORT with a port in 1..65535, got {address!r}")
    return host, int(port)


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Connect once to a cluster's HOST:PORT before ray.init does: where nothing listens, Ray retries for minutes
    (a port past 65535 too) and takes SIGTERM only afterwards. `auto` and `local` are Ray's to resolve."""
    if address in ("auto", "local"):
        return
    try:
        host, port = split_address(address)
    except ValueError as exc:  # from ServeOptions made in code; the command line refuses it first (exit 2)
        raise ServeError(f"--address: {exc}") from None
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:  # refused, unreachable, unknown host, or no answer within timeout_s
        reason = f"no answer in {timeout_s:g} s" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise ServeError(f"--address {address}: cannot reach a Ray cluster there ({reason}); start one with "
                         "`ray start --head`, or leave --address out for a local Ray instance") from None
