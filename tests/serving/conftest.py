"""The serving tests' fixtures: Ray's home for the servers, and the one GPT server the files that use it share."""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from benchmarks.process import ServerProcess


@pytest.fixture(scope="session")
def ray_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """HOME and Ray's temp dir for the servers: under the test tmp dir, unless that is too long for Ray's socket
    paths (107 characters, Ray adds about 70), then a short folder under /tmp, removed afterwards."""
    home = tmp_path_factory.mktemp("ray")
    if len(str(home)) <= 36:
        yield home
        return
    short = Path(tempfile.mkdtemp(prefix="mha-ray-", dir="/tmp"))
    yield short
    shutil.rmtree(short, ignore_errors=True)


# The one GPT server (gpt-mini, four slots) that test_gpt_serve.py and test_gpt_loadtest.py share. The files
# that use it run one after the other, wherever pytest-randomly puts the first (pytest_collection_modifyitems), and
# it stops right after the last test that uses it (pytest_runtest_teardown), not at the session's end: an idle Ray
# server keeps about a quarter of a core busy (docs/measurements/tests.md).
_SHARED_SERVERS: dict[str, ServerProcess] = {}


@pytest.hookimpl(trylast=True)  # after pytest-randomly's shuffle (tryfirst), whose order it otherwise keeps
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the files that use the shared GPT server next to the first of them, each file's tests in their order."""
    def uses(item: pytest.Item) -> bool:
        return "gpt_server" in getattr(item, "fixturenames", ())

    files = {item.path for item in items if uses(item)}
    if len(files) < 2:
        return
    block = [item for item in items if item.path in files]
    by_file = sorted(files, key=lambda path: next(i for i, item in enumerate(block) if item.path == path))
    grouped = [item for path in by_file for item in block if item.path == path]
    first = next(i for i, item in enumerate(items) if item.path in files)
    rest = [item for item in items if item.path not in files]
    items[:] = rest[:first] + grouped + rest[first:]


@pytest.fixture(scope="session")
def gpt_server(gpt_mini: Path, ray_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from benchmarks.process import ServerProcess

    process = ServerProcess(gpt_mini, tmp_path_factory.mktemp("gpt-server-log"), "--max-batch", "4", home=ray_home)
    with process:  # stops it here too if the session ends early (a second stop does nothing)
        _SHARED_SERVERS["gpt_server"] = process
        yield process


@pytest.hookimpl(trylast=True)  # after pytest's own teardown of the item's fixtures
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop a shared server once no later test uses it; a server that does not exit cleanly fails this teardown."""
    for name in [n for n in _SHARED_SERVERS if n in getattr(item, "fixturenames", ())]:
        later = item.session.items[item.session.items.index(item) + 1:]
        if any(name in getattr(i, "fixturenames", ()) for i in later):
            continue
        process = _SHARED_SERVERS.pop(name)
        process.stop()
        assert process.returncode == 0, process.stderr()
        assert process.leftovers == [], "Ray processes outlived the server"
