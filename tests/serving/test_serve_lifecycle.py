"""`mha serve` on the seed preset, started and stopped by the test itself: SIGTERM drains the requests in flight;
`--address` joins a running Ray cluster and leaves it up. Apart from test_serve.py, whose shared server (idle Ray
costs about a quarter of a core) would run beside these servers."""
from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks.process import ServerProcess, free_port, session_members
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.serve.attention.loadtest import check_answers, good_shots, run_load, summarize
from mha_runtime.serve.attention.wire import decode_answer, encode_request


def test_sigterm_drains_the_requests_in_flight(seed_dir: Path, ray_home: Path, tmp_path: Path) -> None:
    """Six requests wait in a batch that fills for 3 s; SIGTERM lands meanwhile: all six are answered, right,
    then the server exits 0 and leaves no Ray process behind."""
    runner = OnnxRunner(seed_dir, provider="cpu")
    xs = [np.random.default_rng(i).standard_normal((1, 1 + i, 3)).astype(np.float32) for i in range(6)]
    results: dict[int, tuple[int, np.ndarray | str]] = {}
    sent = [threading.Event() for _ in xs]

    def send(i: int, port: int) -> None:
        body, content_type = encode_request(xs[i], "npy")
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            connection.request("POST", "/v1/context", body=body, headers={"Content-Type": content_type})
            sent[i].set()  # the whole request is with the server: from here it is in flight
            response = connection.getresponse()
            data = response.read()
            results[i] = (response.status, decode_answer(data, response.getheader("content-type"))
                          if response.status == 200 else data.decode())
        except Exception as exc:
            results[i] = (0, repr(exc))
        finally:
            connection.close()

    process = ServerProcess(seed_dir, tmp_path / "log", "--max-batch", "64", "--batch-wait-ms", "3000",
                            home=ray_home, port=free_port())
    with process:
        threads = [threading.Thread(target=send, args=(i, process.port)) for i in range(6)]
        for thread in threads:
            thread.start()
        # Once all six are sent, SIGTERM; the 3 s batch wait keeps them unanswered meanwhile (asserted below).
        assert all(event.wait(30) for event in sent), "a request could not be sent"
        assert results == {}, results
        signalled = time.monotonic()
        process.terminate()
        for thread in threads:
            thread.join(60)
        assert process.process is not None
        returncode = process.process.wait(60)
        exit_seconds = time.monotonic() - signalled
    assert returncode == 0 and process.leftovers == [], process.stderr()
    for i, x in enumerate(xs):
        status, answer = results[i]
        assert status == 200, answer
        np.testing.assert_allclose(answer, runner.run(x), rtol=1e-5, atol=1e-5)
    assert exit_seconds < 60 and "draining the requests in flight" in process.stderr()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", process.port), timeout=2).close()  # nothing listens any more


def test_address_joins_an_existing_cluster(seed_dir: Path, ray_home: Path, tmp_path: Path) -> None:
    """`ray start --head` (token auth, as Ray 2.60 starts), then `mha serve --address`: the application runs on
    that cluster; SIGTERM deletes it and leaves the cluster up; then the test stops the head."""
    ray = Path(sys.executable).parent / "ray"
    env = dict(os.environ, HOME=str(ray_home), RAY_TMPDIR=str(ray_home / "t"), RAY_AUTH_MODE="token",
               RAY_USAGE_STATS_ENABLED="0")
    (ray_home / "t").mkdir(exist_ok=True)
    if not (ray_home / ".ray" / "auth_token").exists():
        subprocess.run([ray, "get-auth-token", "--generate"], env=env, capture_output=True, check=True, timeout=60)
    head_port = free_port()
    with open(tmp_path / "head.txt", "wb") as log:
        head = subprocess.Popen([ray, "start", "--head", "--block", "--port", str(head_port), "--num-cpus", "2",
                                 "--include-dashboard", "false", "--disable-usage-stats"], stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        _wait_until_listening(head, head_port, tmp_path / "head.txt")
        process = ServerProcess(seed_dir, tmp_path / "log", "--address", f"127.0.0.1:{head_port}", home=ray_home)
        with process:
            connection = http.client.HTTPConnection("127.0.0.1", process.port, timeout=30)
            connection.request("GET", "/v1/health")
            assert connection.getresponse().status == 200
            connection.close()
            shots = good_shots(load_manifest(seed_dir).config, tokens=(1, 6), batches=(1, 2), fmt="npy", seed=5)
            outcomes, seconds = run_load(process.url, shots, count=40, concurrency=4, max_seconds=60, timeout_s=60)
            check_answers(outcomes, shots, OnnxRunner(seed_dir, provider="cpu").run,
                          load_manifest(seed_dir).artifacts["mha.onnx"].tolerance)
            assert summarize(outcomes, seconds, count=40)["errors"] == 0
        assert process.returncode == 0 and process.leftovers == [], process.stderr()
        assert "on the Ray cluster at" in process.stderr() and head.poll() is None  # the cluster is still up
    finally:
        head.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while session_members(head.pid) and time.monotonic() < deadline:
            time.sleep(0.2)  # polling a condition with a deadline; moved here unchanged from test_serve.py
        for pid in session_members(head.pid):  # `ray start --block` takes its time: this cluster was the test's own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        head.wait(30)
        deadline = time.monotonic() + 10
        while session_members(head.pid) and time.monotonic() < deadline:
            time.sleep(0.2)  # killed children linger as zombies until init reaps them
        assert session_members(head.pid) == []


def _wait_until_listening(head: subprocess.Popen[bytes], port: int, log: Path, timeout_s: float = 180.0) -> None:
    """Until the head's GCS port takes a connection: `mha serve --address` connects once and refuses an address
    where nothing listens yet."""
    deadline = time.monotonic() + timeout_s
    while head.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)  # polling a condition with a deadline, as above
    raise AssertionError(f"`ray start --head` is not listening on {port}: {log.read_text()[-2000:]}")

