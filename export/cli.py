"""The `mha` command: thin click wrappers over plain functions. Torch is imported only where needed."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from runtime.config import PRESETS
from runtime.errors import MHAError
from runtime.providers import CHOICES

DEFAULT_OUT = Path("artifacts")


class _Group(click.Group):
    """Turns every MHAError into one line on stderr and exit status 1, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MHAError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Group)
def cli() -> None:
    """Export, validate, run and inspect the chapter 3 causal multi-head attention."""


@cli.command("export")
@click.option("--preset", "presets", multiple=True, type=click.Choice(list(PRESETS)), help="Preset(s) to export (default: all).")
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT, show_default=True, help="Folder for <preset>/ folders.")
@click.option("--weights", type=click.Path(path_type=Path), default=None, help=".safetensors or torch state_dict (one preset only).")
@click.option("--opset", type=int, default=18, show_default=True, help="ONNX opset of mha.onnx (18..25).")
@click.option("--variants", default="all", show_default=True,
              help="Comma-separated variants: fused, attention, contrib, blocks, fp16, int8, ort, decode; or 'all' / 'none'.")
def export_cmd(presets: tuple[str, ...], out: Path, weights: Path | None, opset: int, variants: str) -> None:
    """Export, validate and place the artifacts of each preset."""
    from export.onnx_export import check_opset
    from export.pipeline import export_preset
    from export.report import ARTIFACT_HEADERS, artifact_rows, table
    from export.variants import parse_variants

    names = list(presets) or list(PRESETS)
    if weights is not None and len(names) != 1:
        raise click.UsageError(f"--weights fits one preset; got {len(names)} ({', '.join(names)}): add --preset NAME")
    check_opset(opset)  # refuse before any work starts
    chosen = parse_variants(variants)
    rows = []
    for name in names:
        click.echo(f"exporting {name} ...", err=True)
        result = export_preset(name, out, weights=weights, opset=opset, progress=True, variants=chosen)
        rows += artifact_rows(name, result.manifest)
        click.echo(f"  {name}: done in {result.seconds:.1f} s", err=True)
    click.echo(table(ARTIFACT_HEADERS, rows))
    click.echo("artifacts in " + ", ".join(str(Path(out) / n) for n in names))


@cli.command("validate")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
def validate_cmd(artifact_dir: Path) -> None:
    """Rerun the full sweep of every artifact against the eager wrapper rebuilt from the folder."""
    from export.check import revalidate
    from export.report import table

    reports = revalidate(artifact_dir, progress=True)
    rows = [[f, r.cases, f"{r.max_abs:.2e}", f"{r.rel_l2:.2e}", f"atol {r.spec.tolerance.atol:g}"] for f, r in reports.items()]
    click.echo(table(["artifact", "cases", "max abs err", "rel L2 err", "tolerance"], rows))
    click.echo(f"{sum(r.cases for r in reports.values())} passed, 0 failed")


@cli.command("run")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--input", "input_path", type=click.Path(path_type=Path), required=True, help="x: .npy, [batch, tokens, d_in].")
@click.option("--output", "output_path", type=click.Path(path_type=Path), required=True, help="Where to write context (.npy).")
@click.option("--model", default="mha.onnx", show_default=True, help="Which ONNX file, when ARTIFACT is a folder.")
@click.option("--provider", type=click.Choice(CHOICES), default="auto", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Intra-op threads (default: ONNX Runtime's).")
def run_cmd(artifact: Path, input_path: Path, output_path: Path, model: str, provider: str, threads: int | None) -> None:
    """Run one input through an ONNX artifact (folder or .onnx file) with ONNX Runtime."""
    from export.atomic import write_file_atomic
    from runtime.arrays import load_npy, npy_bytes
    from runtime.errors import ContractError
    from runtime.runner import OnnxRunner

    x = load_npy(input_path)
    runner = OnnxRunner(artifact, model=model, provider=provider, threads=threads)
    y = runner.run(x)
    if not output_path.parent.is_dir():
        raise ContractError(f"--output {output_path}: expected an existing folder {output_path.parent}, found none")
    write_file_atomic(output_path, npy_bytes(y))
    click.echo(f"wrote {output_path} {list(y.shape)} float32 ({runner.provider})")


@cli.command("check")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--provider", type=click.Choice(CHOICES), default="cpu", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None)
def check_cmd(artifact_dir: Path, provider: str, threads: int | None) -> None:
    """Run every golden case on every artifact; the last line is `N passed, N failed`."""
    from export.check import check_golden
    from runtime.golden import summary_line

    results = check_golden(artifact_dir, provider=provider, threads=threads)
    for result in results:
        click.echo(result.line())
    click.echo(summary_line(results))
    if not results or not all(r.ok for r in results):
        sys.exit(1)


@cli.command("inspect")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect_cmd(artifact_dir: Path, as_json: bool) -> None:
    """Show the contract, files, sizes and validation results of an artifact folder."""
    from export.report import ARTIFACT_HEADERS, artifact_rows, human_size, table
    from runtime.manifest import load_manifest

    manifest = load_manifest(artifact_dir)
    if as_json:
        click.echo(json.dumps(manifest, indent=2))
        return
    contract = manifest["contract"]
    click.echo(f"preset {manifest['preset']}  opset {manifest['opset']}  created {manifest['created']}")
    click.echo(f"config   {json.dumps(manifest['config'])}")
    click.echo(f"input    {contract['input']['name']} {contract['input']['dtype']} {contract['input']['shape']}")
    click.echo(f"output   {contract['output']['name']} {contract['output']['dtype']} {contract['output']['shape']}")
    click.echo(f"limits   1 <= tokens <= {contract['limits']['tokens_max']}, batch >= 1")
    click.echo(f"versions {json.dumps(manifest['versions'])}")
    click.echo(f"weights  {manifest['weights']['source']}\n")
    click.echo(table(ARTIFACT_HEADERS, artifact_rows(manifest["preset"], manifest)) + "\n")
    files = manifest["files"]
    click.echo(table(["file", "size", "sha256"], [[f, human_size(i["size"]), i["sha256"][:16]] for f, i in files.items()]))


@cli.command("bench")
@click.option("--preset", default="gpt2-small", show_default=True, type=click.Choice(list(PRESETS)))
@click.option("--artifacts", "root", type=click.Path(path_type=Path), default=DEFAULT_OUT, show_default=True,
              help="Folder holding <preset>/ (made by `mha export`).")
@click.option("--tokens", default="16,64,256,1024", show_default=True, help="Comma-separated token counts (batch 1).")
@click.option("--threads", type=click.IntRange(min=1), default=os.cpu_count() or 1, show_default=True,
              help="Threads for torch and ONNX Runtime alike.")
@click.option("--rounds", type=click.IntRange(min=1), default=10, show_default=True, help="Interleaved timing rounds.")
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT / "bench", show_default=True)
@click.option("--only", default="", help="Comma-separated runners to time (the eager wrapper always runs).")
@click.option("--settle", type=click.FloatRange(min=0.0), default=0.3, show_default=True,
              help="Idle seconds before each timed call, so one runner's threads do not slow the next.")
def bench_cmd(preset: str, root: Path, tokens: str, threads: int, rounds: int, out: Path, only: str,
              settle: float) -> None:
    """Latency of every runner side by side, against ONNX Runtime's own MatMul peak; writes JSON and a plot."""
    from export.bench import SUMMARY_HEADERS, run_bench, summary_rows, write_outputs
    from export.report import human_size, table

    try:
        counts = sorted({int(t) for t in tokens.split(",") if t.strip()})
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {tokens!r}", param_hint="--tokens") from None
    chosen = [name.strip() for name in only.split(",") if name.strip()] or None
    result = run_bench(root / preset, tokens=counts, threads=threads, rounds=rounds, only=chosen, settle=settle)
    json_path, png_path = write_outputs(result, out)
    peak = result["matmul_peak"]
    click.echo(f"{preset}, batch 1, {threads} threads, {rounds} rounds; {result['machine']['cpu']}")
    click.echo(f"MatMul peak (ONNX Runtime, {peak['n']}^2 fp32): {peak['gflops']:.1f} GFLOP/s\n")
    click.echo(table(SUMMARY_HEADERS, summary_rows(result)) + "\n")
    rows = [[f, human_size(a["size_bytes"]), "-" if a["cold_start_s"] is None else f"{1e3 * a['cold_start_s']:.1f}",
             "-" if a["export_seconds"] is None else f"{a['export_seconds']:.2f}"] for f, a in result["artifacts"].items()]
    click.echo(table(["artifact", "size", "cold start ms (1 token)", "export s"], rows))
    if "decode" in result:
        d, full = result["decode"], result["decode"]["full_recompute"]
        click.echo(f"\ndecode step at past_tokens={d['past_tokens']}: {1e3 * d['median_s']:.3f} ms median over back-to-back "
                   f"steps ({1e3 * d['first_step_after_idle_median_s']:.3f} ms for the first after idle); full recompute "
                   f"at T={full['tokens']} with {full['runner']}: {1e3 * full['median_s']:.2f} ms "
                   f"({d['speedup_vs_full_recompute']:.0f}x)")
    judged = result["judged"]
    if judged["targets"]:
        floors = judged["floors"]
        click.echo(f"\ntargets at T={judged['tokens']} (exact work at the MatMul peak: dense "
                   f"{1e3 * floors['dense_at_peak_s']:.1f} ms, causal {1e3 * floors['causal_at_peak_s']:.1f} ms; "
                   f"3x eager needs {1e3 * floors['needed_for_3x_s']:.1f} ms, 2x {1e3 * floors['needed_for_2x_s']:.1f} ms)")
        click.echo(table(["target", "value", "goal", "met"],
                         [[t["target"], f"{t['value']:.1f} {t['unit']}", f"{t['goal']} {t['unit']}",
                           {True: "yes", False: "NO", None: "-"}[t["met"]]] for t in judged["targets"]]))
    click.echo(f"\nwrote {json_path} and {png_path}")


def main() -> None:
    cli(prog_name="mha")
