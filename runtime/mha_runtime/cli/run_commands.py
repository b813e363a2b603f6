"""`mha run`, `mha check` and `mha inspect`: one input through an artifact, the golden cases, the folder's facts."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from mha_runtime.attention.registry import ONNX
from mha_runtime.cli.options import THREADS
from mha_runtime.infer.providers import CHOICES


@click.command("run")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--input", "input_path", type=click.Path(path_type=Path), required=True,
              help="x: .npy, [batch, tokens, d_in].")
@click.option("--output", "output_path", type=click.Path(path_type=Path), required=True,
              help="Where to write context (.npy).")
@click.option("--model", default=ONNX.file, show_default=True, help="Which ONNX file, when ARTIFACT is a folder.")
@click.option("--provider", type=click.Choice(CHOICES), default="auto", show_default=True)
@click.option("--threads", type=THREADS, default=None, help="Intra-op threads (default: ONNX Runtime's).")
def run_cmd(artifact: Path, input_path: Path, output_path: Path, model: str, provider: str,
            threads: int | None) -> None:
    """Run one input through an ONNX artifact (folder or .onnx file) with ONNX Runtime."""
    from mha_runtime.artifact.atomic import check_file_target, write_file_atomic
    from mha_runtime.attention.npy import load_npy, npy_bytes
    from mha_runtime.kinds import kind_of

    folder = artifact if artifact.is_dir() else artifact.parent  # a file: the folder it was exported into
    kind = kind_of(folder)
    runner_type = kind.needs(kind.runner, "run", folder)
    check_file_target(output_path, "--output")
    x = load_npy(input_path)
    runner = runner_type(artifact, model=model, provider=provider, threads=threads)
    if not runner.verified:
        click.echo(f"note: {runner.path} has no manifest.json beside it: its sha256 is unverified", err=True)
    y = runner.run(x)  # checked finite: nothing is written otherwise
    write_file_atomic(output_path, npy_bytes(y))
    click.echo(f"wrote {output_path} {list(y.shape)} float32 ({runner.provider})")


@click.command("check")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--provider", type=click.Choice(CHOICES), default="cpu", show_default=True)
@click.option("--threads", type=THREADS, default=None)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Also write the results as JSON (the format every runner's check writes).")
def check_cmd(artifact_dir: Path, provider: str, threads: int | None, json_path: Path | None) -> None:
    """Run every golden case on every artifact (of a decoder folder: every golden generation); the last line is
    `N passed, N failed`."""
    from mha_runtime.artifact.atomic import check_file_target, write_file_atomic
    from mha_runtime.artifact.results import results_json, summary_line
    from mha_runtime.kinds import kind_of

    if json_path is not None:
        check_file_target(json_path, "--json")
    results = kind_of(artifact_dir).check(artifact_dir, provider=provider, threads=threads)
    for result in results:
        click.echo(result.line())
    if json_path is not None:
        doc = results_json(results, runtime="python", artifact_dir=artifact_dir)
        write_file_atomic(json_path, (json.dumps(doc, indent=1) + "\n").encode())
    click.echo(summary_line(results))
    if not any(r.ok for r in results) or any(not r.ok and not r.skipped for r in results):
        sys.exit(1)


@click.command("inspect")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect_cmd(artifact_dir: Path, as_json: bool) -> None:
    """Show the contract, files, sizes and validation results of a folder (of either kind)."""
    from mha_runtime.kinds import kind_of

    kind_of(artifact_dir).inspect(artifact_dir, as_json=as_json)
