"""The bounds of the numbers the `mha` commands take, as click types: a value outside them is a usage error (one
line, exit 2) before anything starts."""
from __future__ import annotations

import math
from typing import Any

import click

from mha_runtime.serve.ports import split_address

# More threads than the cores of any CPU in use: each one is a stack and a pool worker (100,000 asked of
# `mha generate` grew to 16 GB before the kernel stopped it).
MAX_THREADS = 1024
# Requests in one ONNX Runtime call, or generations stepped together (Ray Serve's batch, the engine's slots,
# Triton's max_batch_size, an int32).
MAX_BATCH = 4096
# Replica processes of one Serve application: above any cluster this serves, far below what would fork the host
# to a halt (each one loads the model; Ray starts them all, as they ask for no CPU).
MAX_REPLICAS = 1024
# The longest a batch may wait to fill: launcher.DRAIN_TIMEOUT_S (not imported: the launcher is loaded only to
# serve). A longer wait held a lone request for as long as it said (1e308 ms: for ever), and SIGTERM's drain
# would cut requests that were only waiting for their batch to fill.
MAX_BATCH_WAIT_MS = 20_000.0
THREADS = click.IntRange(1, MAX_THREADS)
REPLICAS = click.IntRange(1, MAX_REPLICAS)
BATCH = click.IntRange(1, MAX_BATCH)


class Finite(click.FloatRange):
    """A FloatRange that also refuses nan and inf: click's range lets NaN through (every comparison is false)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class RayAddress(click.ParamType):
    """A Ray cluster's address as ray.init takes it: auto, local, HOST:PORT or ray://HOST:PORT (Ray itself retries
    a port past 65535 for minutes)."""

    name = "address"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value not in ("auto", "local"):
            try:
                split_address(str(value))
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
        return value
