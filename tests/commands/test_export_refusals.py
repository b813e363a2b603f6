"""The hostile inputs of `mha export`, as one table run against both model kinds where the flags are shared (the
attention's `mha export` and `mha export --gpt`): each refusal is exactly one stderr line naming the problem,
exit 2 for a bad flag or value and 1 for a bad file, nothing on stdout, nothing written under --out, and an
existing folder of the same name left byte for byte as it was."""
from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from mha_runtime.cli.main import cli

# Each kind's own flags for a job that would otherwise run: a preset, and a config file's valid fields.
KINDS = {
    "attention": {"flags": [], "preset": "seed",
                  "config": {"d_in": 3, "d_out": 2, "num_heads": 2, "context_length": 6},
                  "bad_field": ("num_heads", -1)},
    "gpt": {"flags": ["--gpt"], "preset": "gpt-mini",
            "config": {"vocab_size": 300, "context_length": 16, "emb_dim": 16, "n_heads": 2, "n_layers": 1},
            "bad_field": ("n_heads", -1)},
}


@dataclass(frozen=True)
class Case:
    """`args(tmp, kind)` -> the flags after `export` (and --gpt); the exit code; what the one line must hold."""

    args: Callable[[Path, dict], list[str]]
    code: int
    texts: tuple[str, ...]
    kinds: tuple[str, ...] = ("attention", "gpt")


def _config(tmp: Path, kind: dict, **changes: object) -> str:
    path = tmp / "config.json"
    path.write_text(json.dumps(kind["config"] | changes))
    return str(path)


def _preset(kind: dict) -> list[str]:
    return ["--preset", kind["preset"]]


class _RunsCode:
    """A pickle that would create a file when loaded with weights_only=False."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return os.system, (f"touch {self.marker}",)


def _evil(tmp: Path) -> str:
    path = tmp / "evil.pth"
    path.write_bytes(pickle.dumps({"w": _RunsCode(tmp / "ran")}, protocol=2))
    return str(path)


CASES: dict[str, Case] = {
    "name escapes --out": Case(lambda t, k: [*_preset(k), "--name", "../escape"], 2, ("--name", "'../escape'")),
    "name is .": Case(lambda t, k: [*_preset(k), "--name", "."], 2, ("--name", "starts with a letter or digit")),
    "name of 300 characters": Case(lambda t, k: [*_preset(k), "--name", "a" * 300], 2, ("(300 characters)",)),
    "unknown variant": Case(lambda t, k: [*_preset(k), "--name", "keep", "--variants", "bogus"], 2, ("'bogus'",)),
    "unknown preset": Case(lambda t, k: ["--preset", "gpt5"], 2, ("'gpt5'",)),
    "preset and config": Case(lambda t, k: [*_preset(k), "--config", _config(t, k), "--name", "keep"], 2,
                              ("--preset and --config exclude each other",)),
    "config without name": Case(lambda t, k: ["--config", _config(t, k)], 2, ("needs --name",)),
    "config field out of range": Case(lambda t, k: ["--config", _config(t, k, **dict([k["bad_field"]])), "--name",
                                                    "keep"], 2, ("--config", "heads'", "a positive integer, got -1")),
    "config field unknown": Case(lambda t, k: ["--config", _config(t, k, colour=1), "--name", "keep"], 2,
                                 ("'colour'",)),
    "config not JSON": Case(lambda t, k: ["--config", str(_write(t / "c.json", "{not json")), "--name", "keep"], 1,
                            ("expected JSON",)),
    "config missing": Case(lambda t, k: ["--config", str(t / "none.json"), "--name", "keep"], 1,
                           ("found nothing there",)),
    "config is a folder": Case(lambda t, k: ["--config", str(t), "--name", "keep"], 1, ("a folder",)),
    "weights missing": Case(lambda t, k: [*_preset(k), "--name", "keep", "--weights", str(t / "none.pt")], 1,
                            ("found nothing there",)),
    # no --preset, no --config: "--weights needs --config gpt.json" (exit 2) said what was not wrong; the same line and
    # code as with a preset (a path that holds nothing is a bad file, as a --config that holds nothing is)
    "weights missing, nothing else": Case(lambda t, k: ["--weights", str(t / "none.safetensors"), "--name", "keep"], 1,
                                          ("--weights", "none.safetensors", "found nothing there"), ("gpt",)),
    # a Hugging Face checkpoint's folder, config.json in it: "--weights needs --config ..., a config.json beside the
    # checkpoint" said what was not wrong
    "weights a folder": Case(lambda t, k: ["--weights", str(t), "--name", "keep"], 1,
                             ("expected a regular file", "got a folder"), ("gpt",)),
    "tokenizer a device": Case(lambda t, k: [*_preset(k), "--name", "keep", "--tokenizer", "/dev/null"], 1,
                               ("--tokenizer /dev/null", "got a character device"), ("gpt",)),
    "weights a device": Case(lambda t, k: [*_preset(k), "--name", "keep", "--weights", "/dev/zero"], 1,
                             ("expected a regular file", "character device")),
    "weights text named .pth": Case(lambda t, k: [*_preset(k), "--name", "keep", "--weights",
                                                  str(_write(t / "notes.pth", "hello\n"))], 1,
                                    ("a torch.save file (a zip or a pickle), got text",)),
    "weights empty": Case(lambda t, k: [*_preset(k), "--name", "keep", "--weights", str(_write(t / "e.pt", ""))], 1,
                          ("got an empty file",)),
    "weights a pickle that runs code": Case(lambda t, k: [*_preset(k), "--name", "keep", "--weights", _evil(t)], 1,
                                            ("refused: its pickle holds objects other than tensors",)),
    "out is a file": Case(lambda t, k: [*_preset(k), "--name", "keep", "--out", str(_write(t / "f", "x"))], 1,
                          ("expected a folder, found a file",)),
    "opset out of range": Case(lambda t, k: [*_preset(k), "--name", "keep", "--opset", "12"], 2,
                               ("--opset: expected 18..25, got 12",), ("attention",)),
    # gpt.onnx was built at its own opset, the flag silently ignored
    "opset with --gpt": Case(lambda t, k: [*_preset(k), "--name", "keep", "--opset", "20"], 2,
                             ("--opset sets the attention's mha.onnx",), ("gpt",)),
    "layer without weights": Case(lambda t, k: [*_preset(k), "--name", "keep", "--layer", "0"], 2,
                                  ("--layer",), ("attention", "gpt")),
    "tokenizer without --gpt": Case(lambda t, k: [*_preset(k), "--name", "keep", "--tokenizer", str(t)], 2,
                                    ("add --gpt",), ("attention",)),
    "context_length 1": Case(lambda t, k: ["--config", _config(t, k, context_length=1), "--name", "keep"], 2,
                             ("'context_length': expected at least 2",), ("gpt",)),
    "variants of 5000 characters": Case(lambda t, k: [*_preset(k), "--name", "keep", "--variants", "x" * 5000], 2,
                                        ("got '" + "x" * 40 + "...'",), ("gpt",)),
    # the attention's line quoted all 5000 characters
    "variant name of 5000 characters": Case(lambda t, k: [*_preset(k), "--name", "keep", "--variants", "x" * 5000],
                                            2, ("unknown variant '" + "x" * 40 + "...'",), ("attention",)),
    "lossy form without inplace": Case(lambda t, k: [*_preset(k), "--name", "keep", "--variants", "int8"], 2,
                                       ("add inplace",), ("gpt",)),
    # the attention's ',' exported the core pair alone, as 'none' would, with exit 0
    "no forms at all": Case(lambda t, k: [*_preset(k), "--name", "keep", "--variants", ","], 2,
                            ("--variants",)),
}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("case", "kind"), [(case, kind) for case, spec in CASES.items() for kind in spec.kinds])
def test_a_hostile_export_is_one_line_and_writes_nothing(tmp_path: Path, case: str, kind: str) -> None:
    spec = CASES[case]
    out = tmp_path / "out"
    (out / "keep" / "golden").mkdir(parents=True)
    (out / "keep" / "manifest.json").write_text('{"an": "existing export"}\n')
    (out / "keep" / "golden" / "cases.json").write_bytes(os.urandom(64))
    before = _snapshot(out)
    args = spec.args(tmp_path, KINDS[kind])
    if "--out" not in args:
        args += ["--out", str(out)]
    result = CliRunner().invoke(cli, ["export", *KINDS[kind]["flags"], *args])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == spec.code, result.stderr
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in lines[0] and "internal error" not in lines[0]
    assert all(text in lines[0] for text in spec.texts), lines[0]
    assert result.stdout == ""
    assert _snapshot(out) == before and sorted(p.name for p in out.iterdir()) == ["keep"]
    assert not (tmp_path / "ran").exists()  # the pickle's code never ran
