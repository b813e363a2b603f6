"""Ray Serve's own floor: a no-op HTTP ingress on the path `mha serve` uses, so that the serve bench can say how
much of the server's overhead is ours and how much is Ray Serve's on this machine.

It is started as `mha serve` is (`FloorProcess`, a child in a session of its own), with the launcher's settings:
its Ray environment, a private local Ray instance, Serve's HTTP options on loopback, one replica asking for no
CPU, the same `max_ongoing_requests` and drain. Each request's body is read in full (as the real server reads
it); the answer is a fixed 16-byte JSON document, or, with the `x-floor-echo` header, the request's own bytes
(an answer of the real server's size for a model whose d_in is its d_model).

    python -m benchmarks.serve_floor --port 8001      # "serving ..." on stdout; SIGTERM drains and stops
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

import click

from benchmarks.process import ServerProcess
from mha_runtime.artifact.errors import ServeError, first_line
from mha_runtime.serve.launcher import DRAIN_TIMEOUT_S, RAY_ENV, check_port, own_stdout

APP_NAME = "floor"
ECHO = "x-floor-echo"
FIXED_REPLY = b'{"status": "ok"}'
# The launcher's value at its default --max-batch 16: max(2 * max_batch, 32).
MAX_ONGOING_REQUESTS = 32


def floor_app() -> Any:
    """The bound Serve application (imports ray: call it after Ray's environment is set)."""
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class NoOpDeployment:
        """HTTP ingress that reads the body and answers at once: Serve's path with no work of ours on it."""

        async def __call__(self, request: Request) -> Response:
            body = await request.body()
            if request.headers.get(ECHO):
                return Response(body, media_type=request.headers.get("content-type"))
            return Response(FIXED_REPLY, media_type="application/json")

    return NoOpDeployment.options(
        num_replicas=1, max_ongoing_requests=MAX_ONGOING_REQUESTS,
        graceful_shutdown_wait_loop_s=0.2, graceful_shutdown_timeout_s=DRAIN_TIMEOUT_S,
    ).bind()


def serve_floor(*, host: str, port: int) -> None:
    """Serve the no-op application until SIGTERM or SIGINT, then drain and stop Ray."""
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    check_port(host, port)
    with own_stdout() as out:
        _serve(host, port, out)


def _serve(host: str, port: int, out: TextIO) -> None:
    import ray
    from ray import serve

    try:
        ray.init(address="local", num_cpus=max(2, os.cpu_count() or 1), include_dashboard=False,
                 logging_level=logging.WARNING, log_to_driver=False)
    except Exception as exc:
        raise ServeError(f"cannot start Ray: {first_line(exc)}") from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # after ray.init, which installs its own handler
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    try:
        serve.start(http_options={"host": host, "port": port},
                    logging_config={"log_level": "WARNING", "enable_access_log": False})
        serve.run(floor_app(), name=APP_NAME, route_prefix="/", blocking=False)
    except Exception as exc:
        ray.shutdown()
        raise ServeError(f"cannot start the floor application: {first_line(exc)}") from None
    print(f"serving the no-op floor at http://{host}:{port}/", file=out, flush=True)
    while not stop.wait(0.5):
        pass
    try:
        serve.delete(APP_NAME, _blocking=True)
    finally:
        ray.shutdown()
    print("stopped", file=out, flush=True)


class FloorProcess(ServerProcess):
    """The floor in a child process of its own session, started and stopped as ServerProcess starts `mha serve`
    (ready once it says "serving" and GET /v1/health answers 200; no Ray process outlives stop())."""

    def __init__(self, log_dir: Path, *, home: Path | None = None, env: dict[str, str] | None = None,
                 ready_timeout_s: float = 180.0) -> None:
        super().__init__(Path(os.devnull), log_dir, home=home, ready_timeout_s=ready_timeout_s)
        self.command = [sys.executable, "-m", "benchmarks.serve_floor", "--host", "127.0.0.1",
                        "--port", str(self.port)]
        # benchmarks/ is not installed: the checkout it lives in goes on the child's path, wherever it runs from
        checkout = str(Path(__file__).resolve().parents[1])
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in (checkout, self.env.get("PYTHONPATH")) if p)
        self.env.update(env or {})


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
def main(host: str, port: int) -> None:
    """Serve Ray Serve's no-op floor until SIGTERM."""
    try:
        serve_floor(host=host, port=port)
    except ServeError as exc:
        raise click.ClickException(str(exc)) from None


if __name__ == "__main__":
    main()
