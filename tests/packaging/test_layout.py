"""The house's size rules (DESIGN.md section 2, issue 57): every module of both packages at most 320 lines, every
room (a package folder) at most 13 modules, and the tests in folders by area, each file in exactly one."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import REPO

PACKAGES = (REPO / "export" / "mha_export", REPO / "runtime" / "mha_runtime")
MAX_LINES = 320
MAX_MODULES = 13
AREAS = {"attention", "decoder", "native", "serving", "packaging", "commands"}


def _rooms() -> list[Path]:
    return sorted(d for root in PACKAGES for d in (root, *root.rglob("*"))
                  if d.is_dir() and (d / "__init__.py").is_file())


@pytest.mark.parametrize("room", _rooms(), ids=lambda d: str(d.relative_to(REPO)))
def test_a_room_holds_at_most_13_modules_of_at_most_320_lines(room: Path) -> None:
    modules = sorted(p for p in room.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= MAX_MODULES, f"{room.relative_to(REPO)}: {len(modules)} modules; split it by concern"
    long = {p.name: n for p in modules if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"{room.relative_to(REPO)}: modules over {MAX_LINES} lines: {long}"


def test_the_rules_see_every_room() -> None:
    """The walk above finds the rooms it must (a wrong root would pass every room vacuously)."""
    names = {str(d.relative_to(REPO)) for d in _rooms()}
    assert {"export/mha_export/decoder", "export/mha_export/attention", "runtime/mha_runtime/decoder",
            "runtime/mha_runtime/attention", "export/mha_export/gguf", "runtime/mha_runtime/gguf"} <= names


def test_tests_live_in_their_area() -> None:
    tests = REPO / "tests"
    assert not list(tests.glob("test_*.py")), "a test file at the top of tests/: put it in its area's folder"
    found = {p.parent.name for p in tests.rglob("test_*.py") if "node_modules" not in p.parts}
    assert found == AREAS, f"test areas {sorted(found)}; expected {sorted(AREAS)}"
    names = [p.name for p in tests.rglob("test_*.py") if "node_modules" not in p.parts]
    assert len(names) == len(set(names)), "two test files of one name: pytest imports them by basename"
