"""What `mha serve` was asked for (torch-free, Ray-free: read by the launcher and by each kind's preparation)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mha_runtime.kinds import kind_of


@dataclass(frozen=True, kw_only=True)
class ServeOptions:
    """What `mha serve` was asked for."""

    artifact: Path
    model: str | None = None  # None: the kind's default (mha.onnx; a decoder's fastest in-place form)
    replicas: int = 1
    max_batch: int = 16
    batch_wait_ms: float = 0.0
    host: str = "127.0.0.1"
    port: int = 8000
    address: str | None = None
    provider: str = "cpu"
    threads: int | None = 1
    ingress: str | None = None  # "proxy": Ray Serve's HTTP proxy; "haproxy": HAProxy in front (serve/haproxy.py)

    @property
    def chosen_ingress(self) -> str:
        """`ingress`, or by default the kind's own on a local Ray instance (HAProxy for a decoder: mha_runtime.kinds),
        else the proxy."""
        if self.ingress is not None:
            return self.ingress
        return kind_of(self.artifact).local_ingress if self.address is None else "proxy"

    @property
    def url(self) -> str:
        """The URL the server is at, an IPv6 literal in brackets (RFC 3986): "http://::1:8000" is no URL, and
        `mha loadtest` refused it as not loopback."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"
