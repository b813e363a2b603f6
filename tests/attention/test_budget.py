"""Shapes that cannot be exported, inputs that are not what they claim, and variants this environment cannot
build: each refused in one line before any work, nothing written, and the rest of an export still made."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mha_runtime.attention.registry as registry
from mha_export.pipeline.budget import MAX_CONTEXT, MAX_HEADS, MIN_CONTEXT, check_budget, estimate
from mha_runtime.artifact.errors import ConfigError
from mha_runtime.attention.config import MHAConfig

MHA = Path(sys.executable).parent / "mha"
TINY = {"d_in": 8, "d_out": 8, "num_heads": 2, "context_length": 16}


def _export(tmp_path: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`mha export ARGS` with a torch that cannot be imported first on the path: a refusal comes before any work,
    torch's import (seconds) included."""
    env = dict(os.environ)
    blocker = tmp_path / "no-torch" / "torch"
    blocker.mkdir(parents=True, exist_ok=True)
    (blocker / "__init__.py").write_text("raise ImportError('torch imported before the refusal')\n")
    env["PYTHONPATH"] = os.pathsep.join([str(blocker.parent), *filter(None, [env.get("PYTHONPATH")])])
    return subprocess.run([str(MHA), "export", *map(str, args), "--out", str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, env=env)


def _config(tmp_path: Path, **fields: int) -> Path:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**TINY, **fields}))
    return path


@pytest.mark.parametrize("fields,message,code", [
    ({"context_length": 200_000}, f"context_length 200000: the graph builders support at most {MAX_CONTEXT}", 2),
    # was refused after "exporting ..." by the tracer's example input, exit 1
    ({"context_length": 2}, f"context_length 2: the graph builders need at least {MIN_CONTEXT}", 2),
    ({"num_heads": 100_000, "d_out": 64}, f"num_heads 100000: the faithful trace supports at most {MAX_HEADS}", 2),
    ({"d_in": 10**7, "d_out": 64, "num_heads": 4}, "over the 2.0 GiB a self-contained ONNX file", 2),
    # a value this tool takes, on a machine short of memory: not a usage error
    ({"d_in": 4096, "d_out": 512, "num_heads": 64, "context_length": 4096}, "this machine has", 1),
], ids=["context", "short-context", "heads", "file-size", "memory"])
def test_oversize_shapes_are_refused_before_any_work(tmp_path: Path, fields: dict[str, int], message: str,
                                                     code: int) -> None:
    """Before any work: no output folder, no staging folder, and no "exporting" line (printed once the weights
    are read)."""
    result = _export(tmp_path, "--config", _config(tmp_path, **fields), "--name", "big")
    assert result.returncode == code and result.stdout == "" and message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_memory_estimate_names_its_parts_and_the_machine() -> None:
    config = MHAConfig(d_in=768, d_out=64, num_heads=12, context_length=1024)
    need = estimate(config)
    assert need.weights == 12 * (12 * 3 * 768 * 64) * 4 and need.masks == 4 * 12 * 1024**2 * 4
    assert check_budget(config, available=need.peak) == need
    with pytest.raises(ConfigError, match=r"needs about 1\.9 GiB \(libraries 0\.8 GiB, weights 81 MiB, masks 192 MiB, "
                                          r"validation 0\.8 GiB\); this machine has 1\.8 GiB available"):
        check_budget(config, available=need.peak - 2**26)


def test_a_deeply_nested_config_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 30_000 + "]" * 30_000)  # under the 64 KiB a config may be
    result = _export(tmp_path, "--config", path, "--name", "deep")
    assert result.returncode == 1 and "nesting too deep" in result.stderr and "RecursionError" not in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_weights_and_configs_that_are_not_regular_files_are_named(tmp_path: Path, kind: str) -> None:
    target = {"device": Path("/dev/zero"), "fifo": tmp_path / "pipe", "folder": tmp_path / "dir"}[kind]
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    word = {"fifo": "a FIFO", "device": "a character device", "folder": "a folder"}[kind]
    for args in (["--config", target, "--name", "x"], ["--preset", "seed", "--weights", target]):
        result = _export(tmp_path, *args)
        assert result.returncode == 1 and "expected a regular file" in result.stderr and word in result.stderr, (
            args, result.stderr)
        assert "found nothing there" not in result.stderr and result.stderr.count("\n") == 1
        assert not (tmp_path / "out").exists()


def test_without_executorch_a_named_pte_is_refused_before_any_work(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The other half, a default export that leaves pte out with the install line and makes the rest, is
    tests/packaging/test_install.py's check of the `pip install ./runtime ./export` row: a real venv without
    ExecuTorch."""
    from click.testing import CliRunner

    from mha_runtime.cli.main import cli

    real = registry.importlib.util.find_spec
    monkeypatch.setattr(registry.importlib.util, "find_spec", lambda name, *a: None if name == "executorch"
                        else real(name, *a))
    refused = CliRunner().invoke(cli, ["export", "--config", str(_config(tmp_path)), "--name", "t", "--variants",
                                       "fused,pte", "--out", str(tmp_path / "out")])
    assert refused.exit_code == 1 and not (tmp_path / "out").exists()
    assert "variant 'pte' cannot be built here: needs executorch: pip install './export[executorch]'" in refused.stderr


def test_a_named_variant_this_config_cannot_build_is_refused(tmp_path: Path) -> None:
    result = _export(tmp_path, "--config", _config(tmp_path, d_out=6), "--name", "odd", "--variants",
                     "fused,decode-inplace")
    assert result.returncode == 2 and "variant 'decode-inplace' cannot be built for this config" in result.stderr
    assert not (tmp_path / "out").exists()


def _export_on_a_terminal(tmp_path: Path) -> str:
    """`mha export` with stdout and stderr on a pseudo-terminal; what it drew there."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a terminal has a width
    command = [str(MHA), "export", "--preset", "seed", "--variants", "fused", "--out", str(tmp_path / "tty")]
    proc = subprocess.Popen(command, stdout=follower, stderr=follower, cwd=tmp_path)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert proc.wait(timeout=120) == 0
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_progress_bars_only_on_a_terminal(tmp_path: Path) -> None:
    drawn = _export_on_a_terminal(tmp_path)
    assert "building seed" in drawn and "validating seed" in drawn and "%|" in drawn, drawn  # tqdm's bar
    from click.testing import CliRunner

    from mha_runtime.cli.main import cli

    # Not a terminal: click's runner captures both streams in this process (the same check as a pipe: isatty()).
    piped = CliRunner().invoke(cli, ["export", "--preset", "seed", "--variants", "fused", "--out",
                                     str(tmp_path / "out")])
    assert piped.exit_code == 0 and "building seed" not in piped.stderr and "validating" not in piped.stderr
    assert (tmp_path / "out" / "seed" / "mha.fused.onnx").is_file()  # the export itself ran
