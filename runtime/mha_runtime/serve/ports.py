"""Free ports for the servers `mha serve` starts (HAProxy's stats, metrics and fallback ports) and for the test and
bench harness's servers: drawn between Ray's worker ports and the kernel's ephemeral range, never twice in a process.

Ports the kernel hands out by itself (every outgoing connection, every bind to port 0 of Ray's processes) come
from the ephemeral range, so a port picked there by binding port 0 could be taken before its server binds it, as
Serve's proxy once found ("Failed to bind to address"). A server still fails cleanly if a port is taken between
the probe and its bind.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path

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
