"""Fixtures every area shares: each preset is exported once per test session into a temporary folder. An area's own
fixtures are in its conftest.py (tests/serving, tests/packaging)."""
from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from fresh_export import this_trees_export
from helpers import MID, REPO
from mha_export.attention.pipeline.export import export_preset

if TYPE_CHECKING:
    import torch




class _KernelLibraryNoise(logging.Filter):
    """torchao (installed with the executorch extra) is imported by transformers' quantizer registry and logs one
    warning per CUDA-only kernel library it cannot load on a CPU machine ("Failed to load .../_C_mxfp8...so"): two
    lines on every test that imports transformers, about nothing the test does. Dropped on torchao's own logger, its
    other records kept. Not TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1: that skips its CPU kernels too and logs a warning
    of its own. The product never imports transformers (tests and benchmarks do)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.getMessage().startswith("Failed to load ") and ".so" in record.getMessage())


logging.getLogger("torchao").addFilter(_KernelLibraryNoise())

# The llama.cpp that `make llama-cpp` builds, for every export and check the tests run, in any folder (the runtime
# finds it only through this, its cwd or PATH: a shipped module never climbs to the checkout).
os.environ.setdefault("MHA_LLAMA_CPP", str(REPO / ".cache" / "llama.cpp" / "build" / "bin"))


# make test runs the suite on two processes (pytest-xdist; docs/measurements/tests.md), a group of test modules at a
# time on one process (work_groups): each module whole, so its module fixtures are built once; the modules that
# share a per-process cache together, so that cache is built once too: the real models' folders and transformers
# references (smollm2_folder, gemma3_folder), the Llama-family folders (llama_folders), the chat folder
# (chat_sources); and every serving module together, one after the other: their servers count the HAProxy folders
# and Ray processes of this machine, and share one GPT server (tests/serving/conftest.py).
# Not xdist's loadgroup: it renames each test's nodeid, which pytest 9.2 no longer lets it do (xdist 3.8.0).
SHARED_CACHES = ("smollm2_folder", "gemma3_folder", "llama_folders", "chat_sources")
_USES_CACHE = re.compile(rf"^\s*(?:from|import) ({'|'.join(SHARED_CACHES)})\b", re.MULTILINE)


def work_groups(modules: set[str]) -> dict[str, str]:
    """Test module path (as in a nodeid) -> the name of its group: its own path, or where it holds a key (a cache it
    imports, "serving" for a serving module) the alphabetically first key of the modules joined through shared keys."""
    keys = {m: set(_USES_CACHE.findall((REPO / m).read_text())) | ({"serving"} if m.startswith("tests/serving/")
                                                                    else set()) for m in modules}
    group = {m: m for m in modules}
    for module, held in keys.items():
        for key in sorted(held):  # union: the module and every holder of the key take one name
            old = {group[module], *(group[m] for m, ks in keys.items() if key in ks)}
            name = min(old | {key})
            group = {m: name if g in old else g for m, g in group.items()}
    return group


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: without -n, pytest runs the suite as before
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's loadscope (whole scopes to a worker, the scopes with most tests first), a scope a work group."""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            groups: dict[str, str] = self.__dict__.setdefault("groups", {})
            if module not in groups:
                groups.update(work_groups({n.split("::", 1)[0] for n in self.collection or [nodeid]}))
            return groups[module]

    return GroupScheduling(config, log)


@pytest.fixture(scope="session")
def seed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The seed preset with every default form: `make test`'s own export when it is this tree's (read only), else
    one made here."""
    return _this_trees_export("seed") or export_preset("seed", tmp_path_factory.mktemp("artifacts")).folder


@pytest.fixture(scope="session")
def mid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/data/mid.json with every default form: `make test`'s artifacts/mid when it is this tree's (read only),
    else one made here."""
    return _this_trees_export("mid") or export_preset("mid", tmp_path_factory.mktemp("artifacts"), config=MID).folder


def _this_trees_export(name: str) -> Path | None:
    """artifacts/<name> when it is what this tree's `mha export` writes and its artifacts are the pinned bytes
    (tests/fresh_export.py), else None. `make test` exports seed, gpt2-small and gpt-mini there (for native-test and
    web-test) minutes before pytest, and mid beside them; a second export of them was about two minutes of the suite
    (docs/measurements/tests.md). The tests that get it only read it (those that alter a folder take a copy:
    seed_copy)."""
    return this_trees_export(REPO / "artifacts" / name, pinned=True)


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpt2-small with every default form: `make test`'s own export when it is this tree's (read only), else one
    made here."""
    return _this_trees_export("gpt2-small") or export_preset("gpt2-small", tmp_path_factory.mktemp("artifacts")).folder


@pytest.fixture
def seed_copy(seed_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the seed artifacts that a test may damage."""
    return Path(shutil.copytree(seed_dir, tmp_path / "seed"))


@pytest.fixture
def mid_copy(mid_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the mid artifacts (d_out 16: it has mha.decode-inplace.onnx) that a test may damage."""
    return Path(shutil.copytree(mid_dir, tmp_path / "mid"))


# The GPT folders: each source made by its defining library, exported once per session (gpt_sources.py).
@pytest.fixture(scope="session")
def book_gpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """(the book's GPTModel, its exported folder with the tokenizer): every default form, and gpt.pte where
    ExecuTorch is installed (tests/decoder/test_gpt_pte.py; one export of the book GPT per session)."""
    from gpt_sources import BOOK, BOOK_PTE, book_model, save_book, vocab_dir
    from mha_export.decoder.export import export_gpt
    from mha_export.decoder.plan import parse_gpt_variants

    model = book_model()
    root = tmp_path_factory.mktemp("gpt")
    weights = save_book(model, root / "ckpt")
    variants = parse_gpt_variants("all,pte") if BOOK_PTE else None
    return model, export_gpt("book", root, config=BOOK, weights=weights, tokenizer=vocab_dir(),
                             variants=variants).folder


@pytest.fixture(scope="session")
def hf_gpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """(transformers' GPT2LMHeadModel, its folder exported from model.safetensors + config.json)."""
    from gpt_sources import hf_model, save_hf
    from mha_export.decoder.archs.gpt2.config import GPTConfig
    from mha_export.decoder.export import export_gpt

    model = hf_model()
    root = tmp_path_factory.mktemp("gpt")
    weights = save_hf(model, root / "hf", safetensors=True)
    config = GPTConfig.from_file(weights.parent / "config.json")
    return model, export_gpt("hf", root, config=config, weights=weights).folder


@pytest.fixture(scope="session")
def gpt_mini(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gpt-mini preset with all its forms, gpt.pte included, and GPT-2's tokenizer (seeded weights): `make
    test`'s own artifacts/gpt-mini (`mha export --gpt --preset gpt-mini --variants all,pte`) when it is this tree's
    (read only), else the same export made here."""
    from gpt_sources import vocab_dir
    from mha_export.decoder.archs.gpt2.config import GPT_PRESETS
    from mha_export.decoder.export import export_gpt

    return _this_trees_export("gpt-mini") or export_gpt(
        "gpt-mini", tmp_path_factory.mktemp("gpt-mini"), config=GPT_PRESETS["gpt-mini"], tokenizer=vocab_dir(),
        variants=("all", "pte")).folder
