"""How `mha serve` picks its ingress and words a failed start, without starting Ray: the cause line of a real
Ray task error, and the fallback from a default HAProxy that cannot start to Ray Serve's proxy (the launcher's
start is replaced by a recorder; tests/serving/test_gpt_serve_lifecycle.py does the same against a real server)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.exceptions import RayTaskError

from mha_runtime.artifact.errors import ServeError, cause_line
from mha_runtime.artifact.manifest import DECODER_KIND
from mha_runtime.kinds import KINDS
from mha_runtime.serve import launcher
from mha_runtime.serve import options as serve_options
from mha_runtime.serve.launcher import HAProxyStartError
from mha_runtime.serve.options import ServeOptions

NOTICE = "[NOTICE]   (9) : haproxy version is 2.8.25"
ALERT = "[ALERT]    (9) : Binding [/x/haproxy.cfg:95] for proxy stats: cannot bind socket (Address already in use)"


def ray_error(cause: BaseException) -> BaseException:
    """What a Ray actor method that raised `cause` raises in the driver (Ray's own class, coloured header)."""
    return RayTaskError("ready", "Traceback (most recent call last):\n  File x\nRuntimeError: ...", cause,
                        proctitle="ray::HAProxyManager.ready", pid=7, ip="192.0.2.2", actor_repr="<HAProxyManager>",
                        actor_id="ab12").as_instanceof_cause()


def test_a_ray_task_error_is_one_line_naming_haproxys_alert_without_colours_or_ids() -> None:
    error = ray_error(RuntimeError(f"HAProxy crashed during startup: {NOTICE}\n{ALERT}\n[ALERT] (9) : Exiting."))
    assert "\x1b[" in str(error) and "pid=7" in str(error)  # what Ray's own first line carries
    assert cause_line(error) == f"ray::HAProxyManager.ready(): RuntimeError: {ALERT}"


def test_a_cause_without_alert_gives_its_first_line_and_a_plain_error_its_own() -> None:
    line = cause_line(ray_error(TimeoutError("no answer\nmore")))
    assert line == "ray::HAProxyManager.ready(): TimeoutError: no answer"
    assert cause_line(ray_error(KeyError())).endswith(": KeyError")
    assert cause_line(ValueError("\x1b[31mbad\x1b[0m value\nsecond line")) == "bad value"


class Starts:
    """Stands in for the launcher's start: records each try's ingress and environment, fails the first ones."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.tries: list[tuple[str | None, str | None, bool]] = []

    def __call__(self, options: ServeOptions, files: Any, info: Any, stop: Any) -> None:
        config = os.environ.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC")
        folder_there = config is not None and Path(config).parent.is_dir()
        self.tries.append((options.ingress, os.environ.get("RAY_SERVE_ENABLE_HA_PROXY"), folder_there))
        if len(self.tries) <= self.failures:
            raise HAProxyStartError(f"cannot start the Serve application: ray::HAProxyManager.ready(): {ALERT}")


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Starts]:
    saved = dict(os.environ)  # serve() sets Ray's variables in this process: all are put back afterwards
    for key in [key for key in os.environ if key.startswith("RAY_SERVE_")]:
        del os.environ[key]
    monkeypatch.setattr(launcher, "prepare", lambda options: ({}, {}))
    monkeypatch.setattr(launcher, "check_port", lambda host, port: None)
    # a decoder folder: its kind serves behind HAProxy by default on a local Ray instance (mha_runtime.kinds)
    monkeypatch.setattr(serve_options, "kind_of", lambda folder: KINDS[DECODER_KIND])
    recorder = Starts(failures=1)
    monkeypatch.setattr(launcher, "_start", recorder)
    os.environ["TMPDIR"] = str(tmp_path)  # HAProxy's private folder goes here (tempfile reads it anew)
    monkeypatch.setattr(launcher.tempfile, "tempdir", None)
    yield recorder
    os.environ.clear()
    os.environ.update(saved)


def test_a_default_haproxy_that_fails_gives_way_to_the_proxy_with_one_warning(
        starts: Starts, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    launcher.serve(ServeOptions(artifact=tmp_path))
    assert starts.tries == [("haproxy", "1", True), ("proxy", "0", False)]
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and warning[0].startswith("warning: cannot start the Serve application: ray::")
    assert warning[0].endswith(f"{ALERT}; serving through Ray Serve's proxy instead "
                               "(--ingress haproxy makes this an error)")
    assert list(tmp_path.glob("mha-haproxy-*")) == []  # the first try's folder is gone
    assert not [key for key in os.environ if key.startswith(("RAY_SERVE_HAPROXY_", "RAY_SERVE_ENABLE_HA"))]


@pytest.mark.parametrize("ingress", ["haproxy", "proxy"])
def test_an_ingress_asked_for_by_name_is_never_swapped(starts: Starts, tmp_path: Path, ingress: str) -> None:
    with pytest.raises(ServeError, match=r"HAProxyManager\.ready\(\): \[ALERT\]"):
        launcher.serve(ServeOptions(artifact=tmp_path, ingress=ingress))
    assert starts.tries == [(ingress, "1" if ingress == "haproxy" else "0", ingress == "haproxy")]
    assert list(tmp_path.glob("mha-haproxy-*")) == []


def test_a_user_port_for_haproxy_is_kept_but_the_switch_is_ours_and_both_are_put_back(
        starts: Starts, tmp_path: Path) -> None:
    os.environ["RAY_SERVE_HAPROXY_STATS_PORT"] = "18404"
    os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "0"  # left over from anything: --ingress haproxy must still be HAProxy
    seen: list[tuple[str | None, str | None]] = []

    def start(*args: Any) -> None:
        seen.append((os.environ.get("RAY_SERVE_HAPROXY_STATS_PORT"), os.environ.get("RAY_SERVE_ENABLE_HA_PROXY")))

    launcher._start = start  # type: ignore[assignment]  (the fixture's monkeypatch puts the real one back)
    launcher.serve(ServeOptions(artifact=tmp_path, ingress="haproxy"))
    assert seen == [("18404", "1")]
    assert os.environ["RAY_SERVE_HAPROXY_STATS_PORT"] == "18404" and os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
