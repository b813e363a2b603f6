"""The serve bench's floor server and its HAProxy wiring: it starts behind HAProxy, answers, stops with nothing
of Ray or HAProxy left. No timing asserts (the bench's figures are judged in `make serve-bench` only)."""
from __future__ import annotations

import http.client
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import serve_bench as sb
from benchmarks.process import session_members
from benchmarks.serve_floor import ECHO, FIXED_REPLY, FloorProcess
from mha_runtime.serve.ports import free_port


@pytest.fixture
def short_home() -> Iterator[Path]:
    """Ray's and HAProxy's files: a short folder under /tmp (Ray's and HAProxy's socket paths must stay under
    107 characters; HAProxy's add a 56-character node id), removed afterwards."""
    home = Path(tempfile.mkdtemp(prefix="mha-fl-", dir="/tmp"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


def test_haproxy_env_gives_each_server_its_own_ports_and_files(tmp_path: Path) -> None:
    first, second = sb.haproxy_env(tmp_path), sb.haproxy_env(tmp_path)
    assert first["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    ports = [key for key in first if key.endswith("_PORT")]
    assert len(ports) == 4 and len({first[key] for key in ports}) == 4
    assert all(first[key] != second[key] or not key.endswith("_PORT") for key in first)
    # Below the kernel's ephemeral range, from which Ray's own binds to port 0 draw (mha_runtime/serve/ports.py).
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    drawn = range(20000, low) if low > 20000 else range(low, 65536)
    assert all(int(run[key]) in drawn for run in (first, second) for key in ports)
    paths = [value for key, value in first.items() if key.endswith(("_LOC", "_PATH", "_BASE", "_FILE"))]
    assert len(paths) == 5 and all(Path(value).is_relative_to(tmp_path) for value in paths)


def test_free_port_never_hands_one_port_out_twice() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)


def post(port: int, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/v1/context", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_floor_behind_haproxy_answers_and_stops_clean(short_home: Path, tmp_path: Path) -> None:
    """HAProxy really is in front (its process is in the server's session), the floor reads the body and answers
    the fixed reply or, with the echo header, the body itself; SIGTERM stops it with status 0 and no process left."""
    # Ray floors a direct-ingress replica's drain at 30 s (HAProxy must see it leave); 1 s keeps the test short.
    env = {**sb.haproxy_env(short_home / "h"), "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1"}
    process = FloorProcess(tmp_path / "log", home=short_home, env=env)
    with process:
        assert process.process is not None
        roles = {sb.role(pid) for pid in session_members(process.process.pid)}
        assert {"haproxy", "haproxy manager", "replica", "driver"} <= roles
        body = os.urandom(5000)
        assert post(process.port, body, {"Content-Type": "application/x-npy"}) == (200, FIXED_REPLY)
        assert post(process.port, body, {"Content-Type": "application/x-npy", ECHO: "1"}) == (200, body)
    assert process.returncode == 0 and process.leftovers == []
    assert process.stdout().splitlines()[-1] == "stopped"
    assert session_members(process.process.pid) == []
