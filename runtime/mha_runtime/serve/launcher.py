"""`mha serve`: start Ray (or join a cluster), run the Serve application, and drain it on SIGTERM.

Order matters, and each step below was checked against Ray 2.60:
- Ray's environment is set before `import ray`; Ray prints task errors to sys.stdout, so our own lines go to a
  duplicate of the real stdout and sys.stdout points at stderr while Ray runs.
- the model is loaded and run once here first, so a bad artifact fails in one line, not in a replica's log.
- the port is probed before Ray starts, and Serve's SO_REUSEPORT is off: a second server on a busy port fails
  instead of silently sharing it; a cluster's --address is connected to once, as Ray would wait for minutes.
- ray.init installs its own SIGTERM handler; ours replaces it after ray.init.
- on SIGTERM the application is deleted first (its replicas finish the requests in flight while the HTTP
  proxy still carries their answers back); only then Serve and Ray are shut down.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from mha_runtime.artifact.errors import ServeError, cause_line, first_line
from mha_runtime.kinds import kind_of
from mha_runtime.serve.options import ServeOptions
from mha_runtime.serve.ports import check_reachable

APP_NAME = "mha"
# Before `import ray` (read at import) and inherited by the raylet and workers.
RAY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage-stats prompt or upload
    "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",  # workers run this interpreter, not `uv run`
    "RAY_SERVE_LOG_TO_STDERR": "0",  # replica and controller logs go to files under Ray's temp dir
    "SERVE_SOCKET_REUSE_PORT_ENABLED": "0",  # else two servers on one port split its requests silently
    "RAY_AUTH_MODE": "token",  # Ray 2.60's default for a new local cluster, set so it does not warn
}
DRAIN_TIMEOUT_S = 20.0  # Ray's default: requests still running after this are cut with their replica


def prepare(options: ServeOptions) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Load and run the model once here (a bad artifact, or the decode form, fails before Ray starts); return the
    files the replicas load (sha256-checked) and what /v1/contract answers: the kind's own preparation."""
    return kind_of(options.artifact).prepare_serving(options)


def check_port(host: str, port: int) -> None:
    """Refuse a port something already listens on, in one line and before Ray takes seconds to start."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will: TIME_WAIT is no clash
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ServeError(f"--port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); "
                             "choose a free port") from None


@contextmanager
def own_stdout() -> Iterator[TextIO]:
    """A duplicate of the real stdout for our lines, with sys.stdout pointed at stderr for Ray's."""
    try:
        out: TextIO = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    except (AttributeError, OSError, ValueError):  # no real file behind sys.stdout (an embedding host)
        yield sys.stdout
        return
    saved, sys.stdout = sys.stdout, sys.stderr
    try:
        yield out
    finally:
        sys.stdout = saved
        out.close()


def serve(options: ServeOptions) -> None:
    """Serve until SIGTERM or SIGINT, then drain the requests in flight and return. HAProxy, when it is only the
    default and cannot start, gives way to Ray Serve's proxy after one warning line."""
    if importlib.util.find_spec("ray") is None:  # no serve extra: said (by the CLI) before the model loads
        raise ModuleNotFoundError("No module named 'ray'", name="ray")
    for key, value in RAY_ENV.items():
        os.environ.setdefault(key, value)
    files, info = prepare(options)
    if options.address is None:
        check_port(options.host, options.port)
    else:
        check_reachable(options.address)
    stop = threading.Event()  # one for both tries: a SIGTERM during the first is not lost
    chosen = options.chosen_ingress
    try:
        with _ingress_env(chosen):
            _start(replace(options, ingress=chosen), files, info, stop)
        return
    except HAProxyStartError as exc:
        if options.ingress is not None or stop.is_set():  # asked for by name, or told to stop meanwhile
            raise
        warning = f"warning: {exc}; serving through Ray Serve's proxy instead (--ingress haproxy makes this an error)"
    # HAProxy is the default for speed, never a reason not to serve: a new Ray instance, through Serve's proxy.
    print(warning, file=sys.stderr, flush=True)
    with _ingress_env("proxy"):
        _start(replace(options, ingress="proxy"), files, info, stop)


class HAProxyStartError(ServeError):
    """HAProxy, in front of the replicas, did not start (its [ALERT] is in the message)."""


@contextmanager
def _ingress_env(ingress: str) -> Iterator[None]:
    """Ray's environment for the ingress, set before `import ray` and taken back afterwards: the switch always,
    HAProxy's ports and paths where the user set none. HAProxy's config, sockets and logs go in a private folder
    (mode 700) that is removed when the server exits."""
    switch = os.environ.get("RAY_SERVE_ENABLE_HA_PROXY")
    os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1" if ingress == "haproxy" else "0"
    base = Path(tempfile.mkdtemp(prefix="mha-haproxy-")) if ingress == "haproxy" else None
    added: list[str] = []
    try:
        if base is not None:
            from mha_runtime.serve.haproxy import haproxy_env

            # Ray holds a direct-ingress replica for at least 30 s on shutdown so that HAProxy sees it leave; the
            # application goes at once here, and the requests in flight are drained before that (DRAIN_TIMEOUT_S).
            wanted = {**haproxy_env(base), "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2"}
            added = [key for key in wanted if key not in os.environ]
            os.environ.update({key: wanted[key] for key in added})
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)
        if switch is None:
            os.environ.pop("RAY_SERVE_ENABLE_HA_PROXY", None)
        else:
            os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = switch
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)


def _start(options: ServeOptions, files: dict[str, bytes], info: dict[str, Any], stop: threading.Event) -> None:
    """Import Ray Serve (after its environment is set) and serve."""
    import ray.serve  # noqa: F401

    with own_stdout() as out:
        _serve(options, files, info, out, stop)


def _serve(options: ServeOptions, files: dict[str, bytes], info: dict[str, Any], out: TextIO,
           stop: threading.Event) -> None:
    import ray
    from ray import serve

    local = options.address is None
    print(f"starting {'a local Ray instance' if local else 'on the Ray cluster at ' + options.address} ...",
          file=sys.stderr, flush=True)
    try:
        ray.init(address="local" if local else options.address,  # "local": never a cluster found via RAY_ADDRESS
                 num_cpus=max(2, os.cpu_count() or 1) if local else None,  # logical; replicas ask for none
                 include_dashboard=False if local else None, logging_level=logging.WARNING, log_to_driver=False)
    except Exception as exc:  # ConnectionError, TimeoutError, ValueError for a bad address
        raise ServeError(f"cannot start Ray{'' if local else ' at --address ' + options.address}: "
                         f"{first_line(exc)}") from None
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # after ray.init, which installs its own handler
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # "Started Serve", "Application ready" lines
    try:
        serve.start(http_options={"host": options.host, "port": options.port},
                    logging_config={"log_level": "WARNING", "enable_access_log": False})
        from mha_runtime.serve.deployment import application

        # returns once the replicas are healthy
        serve.run(application(options, files, info), name=APP_NAME, route_prefix="/", blocking=False)
    except Exception as exc:
        ray.shutdown()
        error = HAProxyStartError if "HAProxyManager" in first_line(exc) else ServeError
        raise error(f"cannot start the Serve application: {cause_line(exc)}") from None
    kind = kind_of(options.artifact)
    wait = f", batch wait {options.batch_wait_ms:g} ms" if kind.batch_wait else ""
    print(f"serving {info['name']} ({info['model']}) at {options.url}{kind.route}: {options.replicas} replica(s), "
          f"max batch {options.max_batch}{wait}{', behind HAProxy' if options.ingress == 'haproxy' else ''}",
          file=out, flush=True)
    while not stop.wait(0.5):
        pass
    print("draining the requests in flight ...", file=sys.stderr, flush=True)
    try:
        serve.delete(APP_NAME, _blocking=True)
    except Exception as exc:
        raise ServeError(f"draining failed: {first_line(exc)}") from None
    finally:
        # Local: ray.shutdown() stops the whole instance, Serve's controller and proxy with it (serve.shutdown()
        # first would only add a raylet error line about the killed controller). On a cluster: disconnect, and
        # leave its Serve running; only our application was ours.
        ray.shutdown()
    print("stopped", file=out, flush=True)
