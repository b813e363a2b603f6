"""A GGUF of the GPT run by llama.cpp itself (torch-free): finds and drives `mha-llama-golden`, the small C program
against libllama that tools/llama_cpp.sh builds (`make llama-cpp`) from the pinned llama-cpp-python source
release's bundled llama.cpp (its commands: tools/llama_golden.c).

The program is looked for in $MHA_LLAMA_CPP (a folder; `make` and the tests set it to the checkout's
.cache/llama.cpp/build/bin), else in ./.cache/llama.cpp/build/bin (a checkout's root), else on PATH; a shipped module
never climbs to the checkout.
Without it the export leaves the gguf variant out with BUILD_HINT, and `mha check` reports the GGUF cases as
skipped with it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from mha_runtime.artifact.errors import ArtifactError, cut, first_line
from mha_runtime.artifact.manifest import verify_listed
from mha_runtime.artifact.tolerance import Comparison, Tolerance, compare
from mha_runtime.decoder.golden import GoldenGeneration
from mha_runtime.decoder.manifest import GPTManifest
from mha_runtime.decoder.quality import Windows

PROGRAM = "mha-llama-golden"
ENV = "MHA_LLAMA_CPP"
CHECKOUT_BIN = Path(".cache") / "llama.cpp" / "build" / "bin"  # relative: a checkout's root as the cwd
# What tools/llama_cpp.sh builds from (the tree has no git history: llama.cpp reports its build as "unknown").
SOURCE = "llama-cpp-python==0.3.36 (vendor/llama.cpp)"
BUILD_HINT = f"llama.cpp is not built: run `make llama-cpp` (or set {ENV} to a folder holding {PROGRAM})"


def program() -> Path | None:
    """The built mha-llama-golden, or None."""
    folder = os.environ.get(ENV)
    path = (Path(folder) if folder else CHECKOUT_BIN) / PROGRAM
    if path.is_file() and os.access(path, os.X_OK):
        return path.resolve()
    found = None if folder else shutil.which(PROGRAM)
    return Path(found) if found else None


@dataclass(frozen=True)
class Answers:
    """What one run gave: one JSON object per command, and every logits row written, in command order."""

    lines: list[dict[str, object]]
    logits: np.ndarray  # (rows, V) float32


def threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def run(gguf: Path, commands: list[str], *, where: Path | None = None) -> Answers:
    """Load `gguf` once in llama.cpp and answer `commands` (generate / score / tokenize lines); errors name `where`
    (the listed file that `gguf` is a private copy of), else `gguf`."""
    exe = program()
    if exe is None:
        raise ArtifactError(BUILD_HINT)
    name = where or gguf
    with tempfile.TemporaryDirectory(prefix="mha-llama-") as tmp:
        out = Path(tmp) / "logits.bin"
        done = subprocess.run([str(exe), str(gguf), str(out), "--threads", str(threads()), "--kv", "f32"],
                              input="".join(c + "\n" for c in commands), capture_output=True, text=True,
                              errors="replace", timeout=600.0, check=False)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise ArtifactError(f"{name}: llama.cpp ({PROGRAM}) exited {done.returncode}: {tail}")
        lines = [_answer(line, exe, name) for line in done.stdout.splitlines() if line.strip()]
        head, answers = (lines or [{}])[0], lines[1:]
        if "n_vocab" not in head or len(answers) != len(commands):
            raise ArtifactError(f"{name}: llama.cpp answered {len(answers)} of {len(commands)} commands")
        vocab = head["n_vocab"]
        size = out.stat().st_size if out.is_file() else None
        # A program at $MHA_LLAMA_CPP that is not tools/llama_golden.c's: one line, not numpy's reshape error
        if type(vocab) is not int or vocab < 1 or size is None or size % (4 * vocab):
            raise ArtifactError(f"{name}: {exe} answered n_vocab {vocab!r} and {size} bytes of logits, not "
                                f"float32 rows of n_vocab (is it {PROGRAM} of `make llama-cpp`?)")
        logits = np.fromfile(out, dtype=np.float32).reshape(-1, vocab)
    return Answers(answers, logits)


def _answer(line: str, exe: Path, name: Path) -> dict[str, object]:
    """One answer line: a JSON object (anything else is a program that is not mha-llama-golden)."""
    try:
        answer = json.loads(line)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ArtifactError(f"{name}: {exe} answered {cut(line)!r}, not a JSON object (is it {PROGRAM} of "
                            "`make llama-cpp`?)")
    return answer


def generate(prompt: list[int], new_tokens: int) -> str:
    """Greedy: the new ids, and the first step's logits (one row)."""
    return f"generate {new_tokens} " + " ".join(map(str, prompt))


def score(ids: list[int], first: int) -> str:
    """The logits at positions first .. len(ids) - 1 of one batch (len(ids) - first rows)."""
    return f"score {first} " + " ".join(map(str, ids))


def tokenize(text: str) -> str:
    """The GGUF's own tokenizer on `text` (the BOS where the file's add_bos_token says so, special tokens' text as
    text)."""
    return "tokenize " + text.encode("utf-8").hex()


@contextmanager
def verified_copy(folder: Path, name: str, manifest: GPTManifest) -> Iterator[Path]:
    """A private copy of the listed file `name`, its size and sha256 checked on the bytes copied: llama.cpp reads
    a file by path, so it is handed exactly the bytes that were verified (ArtifactError before it sees any)."""
    with tempfile.TemporaryDirectory(prefix="mha-gguf-") as tmp:
        copy = Path(tmp) / name
        with open(copy, "wb") as sink:
            verify_listed(folder, name, manifest, lambda chunk: _write(sink, chunk, copy))
        yield copy


def _write(sink: BinaryIO, chunk: bytes, copy: Path) -> None:
    """A write to the private copy: its failure (a full disk) is the copy's, not the listed file's."""
    try:
        sink.write(chunk)
    except OSError as exc:
        raise ArtifactError(f"{copy}: cannot write the copy llama.cpp reads ({first_line(exc)})") from None


@dataclass(frozen=True)
class Greedy:
    """llama.cpp on the greedy golden cases: each case's new ids and first-step logits, and its encoding of each
    text prompt."""

    ids: dict[str, list[int]]
    first: dict[str, np.ndarray]
    encoded: dict[str, list[int]]


def greedy_cases(cases: list[GoldenGeneration]) -> list[GoldenGeneration]:
    """The cases llama.cpp reproduces: the greedy ones (sampling is this project's rule, not llama.cpp's)."""
    return [c for c in cases if c.temperature == 0.0]


def greedy_commands(cases: list[GoldenGeneration]) -> list[str]:
    """The commands of the greedy cases (one logits row each, in order), then one tokenize per text prompt."""
    chosen = greedy_cases(cases)
    return ([generate(c.prompt_ids, c.max_new_tokens) for c in chosen]
            + [tokenize(c.prompt_text) for c in chosen if c.prompt_text is not None])


def greedy_answers(cases: list[GoldenGeneration], answers: Answers) -> Greedy:
    """What llama.cpp answered to greedy_commands(cases) (the first answers of a run)."""
    chosen = greedy_cases(cases)
    texts = [c for c in chosen if c.prompt_text is not None]
    ids = [_ids(a) for a in answers.lines[:len(chosen) + len(texts)]]
    if len(answers.logits) < len(chosen):
        raise ArtifactError(f"llama.cpp wrote {len(answers.logits)} logits rows for {len(chosen)} generations")
    return Greedy(ids={c.name: ids[i] for i, c in enumerate(chosen)},
                  first={c.name: answers.logits[i] for i, c in enumerate(chosen)},
                  encoded={c.name: ids[len(chosen) + i] for i, c in enumerate(texts)})


def _ids(answer: dict[str, object]) -> list[int]:
    """The token ids of a generate or tokenize answer."""
    ids = answer.get("ids")
    if not isinstance(ids, list) or not all(type(i) is int for i in ids):
        raise ArtifactError(f"llama.cpp answered {cut(json.dumps(answer))}, not a list of token ids under 'ids'")
    return ids


def run_scored(gguf: Path, cases: list[GoldenGeneration], windows: Windows | None, *, where: Path | None = None
               ) -> tuple[Greedy, np.ndarray | None]:
    """One llama.cpp run: the greedy cases and text prompts, and (windows given) the logits (windows, width - half,
    V) predicting tokens half .. width - 1 of each window (what mha_runtime.decoder.quality.measure scores)."""
    scores = [] if windows is None else [score(w[:-1], windows.half - 1) for w in windows.ids]
    answers = run(gguf, greedy_commands(cases) + scores, where=where)
    got = greedy_answers(cases, answers)
    if windows is None:
        return got, None
    rows = len(greedy_cases(cases))
    return got, answers.logits[rows:].reshape(len(windows.ids), len(windows.ids[0]) - windows.half, -1)


def run_greedy(gguf: Path, cases: list[GoldenGeneration], *, where: Path | None = None) -> Greedy:
    """llama.cpp on the greedy cases of `cases` (errors name `where`, as run's)."""
    return greedy_answers(cases, run(gguf, greedy_commands(cases), where=where))


def judge_case(got: Greedy, case: GoldenGeneration, expected: np.ndarray, tolerance: Tolerance
               ) -> tuple[Comparison, str | None]:
    """(the first-step logits against `expected`, None or why the case fails): ids exact, logits within
    tolerance, a text prompt encoded by the GGUF's tokenizer to the golden prompt ids."""
    result = compare(got.first[case.name], expected, tolerance)
    ids = got.ids[case.name]
    if case.name in got.encoded and got.encoded[case.name] != case.prompt_ids:
        return result, (f"llama.cpp's tokenizer encodes {case.prompt_text!r} to {got.encoded[case.name]}, "
                        f"golden {case.prompt_ids}")
    if ids != case.ids:
        at = next(i for i, (a, b) in enumerate(zip([*ids, -1], [*case.ids, -2], strict=False)) if a != b)
        return result, f"ids differ from token {at}: got {ids[at:at + 4]}, golden {case.ids[at:at + 4]}"
    if not result.ok:
        return result, f"first-step logits beyond tolerance (max abs {result.max_abs:.3g})"
    return result, None
