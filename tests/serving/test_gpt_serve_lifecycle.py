"""`mha serve` on a GPT folder, started and stopped by the test itself: SIGTERM drains the generations in flight;
HAProxy that cannot start is one line when asked for, and the default falls back to Serve's proxy. Apart from
test_gpt_serve.py, whose shared server (idle Ray costs about a quarter of a core) would run beside these servers."""
from __future__ import annotations

import json
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from benchmarks.process import ServerProcess, free_port
from gpt_serving import call, served_answer, solo
from mha_runtime.artifact.errors import ServeError
from mha_runtime.decoder.generate import Generator
from mha_runtime.serve.decoder.wire import GenerateRequest
from mha_runtime.serve.haproxy import CLIENT_TIMEOUT_S


def test_sigterm_drains_the_generations_in_flight(gpt_mini: Path, ray_home: Path, tmp_path: Path) -> None:
    """One slot, six streams of 200 tokens: SIGTERM lands while one runs and two or more wait (a window that stays
    open for four whole generations, so a slow host's health polls still see it); all six end with their `done`
    event, equal to their solo runs, then the server exits 0 and leaves no Ray process, and no file of the HAProxy
    it runs behind by default."""
    haproxy_folders = set(Path(tempfile.gettempdir()).glob("mha-haproxy-*"))
    gen = Generator(gpt_mini)
    reqs = [GenerateRequest([11 + i, 5], 200, stream=True) for i in range(6)]
    results: dict[int, tuple[int, str, str]] = {}
    process = ServerProcess(gpt_mini, tmp_path / "log", "--max-batch", "1", home=ray_home, port=free_port())

    def send(i: int) -> None:
        try:
            results[i] = call(process.port, "POST", "/v1/generate", json.dumps(reqs[i].to_json()).encode())
        except Exception as exc:
            results[i] = (0, "", repr(exc))

    with process:
        running_folders = set(Path(tempfile.gettempdir()).glob("mha-haproxy-*")) - haproxy_folders
        configs = [cfg.read_text() for folder in running_folders for cfg in folder.glob("*/haproxy.cfg")]  # node id
        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(reqs))]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            health = json.loads(call(process.port, "GET", "/v1/health")[2])
            if health["running"] == 1 and health["queued"] >= 2:
                break
            time.sleep(0.01)  # polling a condition with a deadline; moved here unchanged from test_gpt_serve.py
        process.terminate()
        for thread in threads:
            thread.join(120)
        assert process.process is not None
        returncode = process.process.wait(60)
    assert health["running"] == 1 and health["queued"] >= 2, health  # SIGTERM came with generations waiting
    assert returncode == 0 and process.leftovers == [], process.stderr()
    for i, r in enumerate(reqs):
        assert served_answer(*results[i])["ids"] == solo(gen, r, gen.manifest.eos_id)[0]
    assert "draining the requests in flight" in process.stderr()
    # By default behind HAProxy, or (if HAProxy failed to start on this host) a warning saying why it is not.
    behind_haproxy = "behind HAProxy" in process.stdout()
    assert behind_haproxy != ("warning: cannot start the Serve application" in process.stderr()), process.stderr()
    assert len(running_folders) == (1 if behind_haproxy else 0)
    # Ray's own 3600 s let unfinished headers hold a connection for an hour
    assert len(configs) == len(running_folders) and all(f"timeout client {CLIENT_TIMEOUT_S}s" in text
                                                        for text in configs), configs
    assert set(Path(tempfile.gettempdir()).glob("mha-haproxy-*")) == haproxy_folders


def test_haproxy_that_cannot_start_is_one_line_when_asked_for_and_the_default_falls_back_to_the_proxy(
        gpt_mini: Path, ray_home: Path, tmp_path: Path) -> None:
    """HAProxy's stats port (set by the user) is taken. With `--ingress haproxy` the server exits 1 with one line
    that carries HAProxy's own [ALERT], not only the Ray actor method that failed. By default it says so in one
    warning line and serves through Ray Serve's proxy, answers equal to the solo run. Neither leaves a process or
    a HAProxy folder."""
    haproxy_folders = set(Path(tempfile.gettempdir()).glob("mha-haproxy-*"))
    gen = Generator(gpt_mini)
    request = GenerateRequest([7, 8, 9], 12)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        asked = ServerProcess(gpt_mini, tmp_path / "asked", "--ingress", "haproxy", home=ray_home)
        default = ServerProcess(gpt_mini, tmp_path / "default", home=ray_home)
        for process in (asked, default):
            process.env["RAY_SERVE_HAPROXY_STATS_PORT"] = str(port)
        with pytest.raises(ServeError):
            asked.start()
        with default:
            answer = served_answer(*call(default.port, "POST", "/v1/generate", json.dumps(request.to_json()).encode()))
    line = asked.stderr().strip().splitlines()[-1]
    assert asked.returncode == 1 and asked.leftovers == [] and "Traceback" not in asked.stderr()
    assert line.startswith("Error: cannot start the Serve application: ray::HAProxyManager.ready(): "), line
    assert "[ALERT]" in line and "cannot bind socket" in line and line.endswith(f":{port}]"), line
    warnings = [w for w in default.stderr().splitlines() if w.startswith("warning: ")]
    assert len(warnings) == 1 and "[ALERT]" in warnings[0], default.stderr()
    assert warnings[0].endswith("serving through Ray Serve's proxy instead (--ingress haproxy makes this an error)")
    assert "behind HAProxy" not in default.stdout() and default.returncode == 0 and default.leftovers == []
    assert answer["ids"] == solo(gen, request, gen.manifest.eos_id)[0]
    assert set(Path(tempfile.gettempdir()).glob("mha-haproxy-*")) == haproxy_folders
