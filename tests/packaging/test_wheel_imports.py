"""Each shipped package imports only what its distribution declares (its dependencies and extras, and theirs), and
holds only the product: the repository's benchmarks, the demo trainer and test harnesses live outside it.

Read from the source with `ast` (every import, at the top or inside a function), each top-level name mapped to its
distribution by importlib.metadata: an import of an undeclared package fails here, not on a user's machine."""
from __future__ import annotations

import ast
import re
import sys
from functools import cache
from importlib.metadata import packages_distributions, requires
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"mha_runtime": ("runtime", "mha-runtime"), "mha_export": ("export", "mha-export")}


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!;~]", requirement, maxsplit=1)[0].lower().replace("_", "-")


@cache
def closure(dist: str) -> frozenset[str]:
    """`dist` and every distribution it requires, extras included, transitively (as installed here)."""
    seen, pending = set(), [dist]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            reqs = requires(name) or []
        except Exception:  # a requirement of an extra that this environment does not install
            continue
        pending += [_name(r) for r in reqs]
    return frozenset(seen)


def imports(path: Path) -> set[str]:
    """Top-level names of every absolute import in the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", list(PACKAGES))
def test_every_import_is_declared_by_the_distribution(package: str) -> None:
    folder, dist = PACKAGES[package]
    allowed = closure(dist)
    owners = packages_distributions()
    undeclared = []
    for path in sorted((ROOT / folder / package).rglob("*.py")):
        for name in sorted(imports(path)):
            if name in sys.stdlib_module_names or name == package:
                continue
            dists = {d.lower().replace("_", "-") for d in owners.get(name, [])}
            if not dists & allowed:
                undeclared.append(f"{path.relative_to(ROOT)}: {name} ({', '.join(sorted(dists)) or 'not installed'})")
    assert undeclared == [], "imports of packages the distribution does not declare:\n" + "\n".join(undeclared)


@pytest.mark.parametrize("package", list(PACKAGES))
def test_no_shipped_module_finds_the_checkout(package: str) -> None:
    """A module that climbs out of its package to the repository (`parents[3]`, `node_modules`) fails from a wheel."""
    folder = ROOT / PACKAGES[package][0] / package
    climbing = [str(p.relative_to(ROOT)) for p in folder.rglob("*.py")
                if re.search(r"parents\[[2-9]\]|node_modules", p.read_text())]
    assert climbing == []
