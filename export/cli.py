"""The `mha` command: thin click wrappers over plain functions. Torch is imported only where needed."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from mha_runtime.config import PRESETS, MHAConfig, preset
from mha_runtime.errors import MHAError, first_line
from mha_runtime.providers import CHOICES
from mha_runtime.variants import CHOICES as VARIANT_CHOICES
from mha_runtime.variants import ONNX, parse_variants

DEFAULT_OUT = Path("artifacts")
EXPORT_HINT = "this command needs the export extra (torch, onnx): pip install 'mha-export[export]'"
SERVE_HINT = "this command needs the serve extra (Ray Serve): pip install 'mha-export[serve]'"
_TORCH_SIDE = {"torch", "onnx", "onnxscript", "onnx_ir", "safetensors", "matplotlib"}
_SERVE_SIDE = {"ray", "starlette"}


class _Group(click.Group):
    """The one error boundary: every failure is one line on stderr and exit 1 (2 for usage, 130 when
    interrupted), never a traceback; a missing optional dependency says which extra to install.
    MHA_DEBUG=1 lets an unexpected exception through with its traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            root = (exc.name or "").split(".")[0]
            if root in _TORCH_SIDE or root in _SERVE_SIDE:
                hint = EXPORT_HINT if root in _TORCH_SIDE else SERVE_HINT
                raise click.ClickException(f"{hint} (missing module {exc.name!r})") from None
            raise

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            _fail(f"{exc.format_message()}{where}", 2)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except (click.Abort, KeyboardInterrupt):
            _fail("interrupted; nothing was written", 130)
        except MHAError as exc:
            _fail(str(exc), 1)
        except MemoryError:
            _fail("out of memory: the input or the model is too large for this machine", 1)
        except OSError as exc:
            _fail(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or first_line(exc)}", 1)
        except Exception as exc:
            if os.environ.get("MHA_DEBUG"):
                raise
            _fail(f"internal error: {type(exc).__name__}: {first_line(exc)} (MHA_DEBUG=1 shows the traceback)", 1)
        sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


class VariantList(click.ParamType):
    """Comma-separated variant names from the registry, or 'all' / 'none'; a bad name is a usage error."""

    name = "LIST"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        try:
            return parse_variants(str(value))
        except MHAError as exc:
            self.fail(str(exc), param, ctx)


@click.group(cls=_Group)
def cli() -> None:
    """Export, validate, run and inspect the chapter 3 causal multi-head attention."""


@cli.command("export")
@click.option("--preset", "presets", multiple=True, type=click.Choice(list(PRESETS)),
              help="Preset(s) to export (default: all, unless --config).")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="JSON file of MHAConfig fields: your own shape (with --name).")
@click.option("--name", default=None, help="Folder under --out: required with --config; renames one --preset.")
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT, show_default=True,
              help="Folder for the <name>/ folders.")
@click.option("--weights", type=click.Path(path_type=Path), default=None,
              help="Checkpoint (.safetensors, .bin, .pt): the wrapper's state_dict, the book's MultiHeadAttention "
                   "or GPTModel, or Hugging Face GPT-2.")
@click.option("--layer", type=click.IntRange(min=0), default=None,
              help="Which block of a checkpoint that holds several.")
@click.option("--opset", type=int, default=18, show_default=True, help="ONNX opset of mha.onnx (18..25).")
@click.option("--variants", type=VariantList(), default="all", show_default=True,
              help=f"Comma-separated variants: {', '.join(VARIANT_CHOICES)}; or 'all' / 'none'.")
def export_cmd(presets: tuple[str, ...], config_path: Path | None, name: str | None, out: Path,
               weights: Path | None, layer: int | None, opset: int, variants: tuple[str, ...]) -> None:
    """Export, validate and place the artifacts of each preset, or of your own config and weights."""
    from mha_export.atomic import check_folder_target
    from mha_export.onnx_export import check_opset
    from mha_export.pipeline import export_preset
    from mha_export.report import ARTIFACT_HEADERS, artifact_rows, table

    if config_path is not None:
        if presets:
            raise click.UsageError("--preset and --config exclude each other: export a preset or your own config")
        if name is None:
            raise click.UsageError("--config needs --name NAME (the folder under --out)")
        jobs = [(name, MHAConfig.from_file(config_path))]
    else:
        names = list(presets) or list(PRESETS)
        if (weights is not None or name is not None) and len(names) != 1:
            raise click.UsageError(f"--weights and --name fit one preset; got {len(names)} ({', '.join(names)}): "
                                   "add --preset NAME")
        jobs = [(name or n, preset(n)) for n in names]
    if layer is not None and weights is None:
        raise click.UsageError("--layer picks a block of --weights: give --weights FILE")
    check_opset(opset)  # refuse before any work starts
    for folder, _ in jobs:
        check_folder_target(Path(out) / folder)
    rows = []
    for folder, config in jobs:
        click.echo(f"exporting {folder} ...", err=True)
        result = export_preset(folder, out, config=config, weights=weights, layer=layer, opset=opset, progress=True,
                               variants=variants)
        rows += artifact_rows(result.manifest)
        click.echo(f"  {folder}: done in {result.seconds:.1f} s", err=True)
        for note in result.notes:
            click.echo(f"  note: {note}", err=True)
    click.echo(table(ARTIFACT_HEADERS, rows))
    click.echo("artifacts in " + ", ".join(str(Path(out) / folder) for folder, _ in jobs))


@cli.command("validate")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
def validate_cmd(artifact_dir: Path) -> None:
    """Rerun the full sweep of every artifact against the eager wrapper rebuilt from the folder."""
    from mha_export.check import revalidate
    from mha_export.report import table

    reports = revalidate(artifact_dir, progress=True)
    rows = [[f, r.cases, f"{r.max_abs:.2e}", f"{r.rel_l2:.2e}", f"atol {r.spec.tolerance.atol:g}"]
            for f, r in reports.items()]
    click.echo(table(["artifact", "cases", "max abs err", "rel L2 err", "tolerance"], rows))
    click.echo(f"{sum(r.cases for r in reports.values())} passed, 0 failed")


@cli.command("run")
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--input", "input_path", type=click.Path(path_type=Path), required=True,
              help="x: .npy, [batch, tokens, d_in].")
@click.option("--output", "output_path", type=click.Path(path_type=Path), required=True,
              help="Where to write context (.npy).")
@click.option("--model", default=ONNX.file, show_default=True, help="Which ONNX file, when ARTIFACT is a folder.")
@click.option("--provider", type=click.Choice(CHOICES), default="auto", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None, help="Intra-op threads (default: ONNX Runtime's).")
def run_cmd(artifact: Path, input_path: Path, output_path: Path, model: str, provider: str,
            threads: int | None) -> None:
    """Run one input through an ONNX artifact (folder or .onnx file) with ONNX Runtime."""
    from mha_export.atomic import write_file_atomic
    from mha_runtime.arrays import load_npy, npy_bytes
    from mha_runtime.errors import ContractError
    from mha_runtime.runner import OnnxRunner

    if output_path.is_dir() or not output_path.parent.is_dir():
        raise ContractError(f"--output {output_path}: expected a file path in an existing folder")
    x = load_npy(input_path)
    runner = OnnxRunner(artifact, model=model, provider=provider, threads=threads)
    if not runner.verified:
        click.echo(f"note: {runner.path} has no manifest.json beside it: its sha256 is unverified", err=True)
    y = runner.run(x)  # checked finite: nothing is written otherwise
    write_file_atomic(output_path, npy_bytes(y))
    click.echo(f"wrote {output_path} {list(y.shape)} float32 ({runner.provider})")


@cli.command("check")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--provider", type=click.Choice(CHOICES), default="cpu", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=None)
def check_cmd(artifact_dir: Path, provider: str, threads: int | None) -> None:
    """Run every golden case on every artifact; the last line is `N passed, N failed`."""
    from mha_export.check import check_golden
    from mha_runtime.golden import summary_line

    results = check_golden(artifact_dir, provider=provider, threads=threads)
    for result in results:
        click.echo(result.line())
    click.echo(summary_line(results))
    if not any(r.ok for r in results) or any(not r.ok and not r.skipped for r in results):
        sys.exit(1)


@cli.command("inspect")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect_cmd(artifact_dir: Path, as_json: bool) -> None:
    """Show the contract, files, sizes and validation results of an artifact folder."""
    from mha_export.report import ARTIFACT_HEADERS, artifact_rows, human_size, table
    from mha_runtime.contract import DTYPE, INPUT_NAME, OUTPUT_NAME, IOContract
    from mha_runtime.manifest import load_manifest

    manifest = load_manifest(artifact_dir)
    if as_json:
        click.echo(json.dumps(manifest.to_dict(), indent=2))
        return
    contract = IOContract(manifest.config)
    click.echo(f"name     {manifest.name}  opset {manifest.opset}  created {manifest.created}")
    click.echo(f"config   {manifest.config.to_json()}")
    click.echo(f"input    {INPUT_NAME} {DTYPE} {contract.input_shape}")
    click.echo(f"output   {OUTPUT_NAME} {DTYPE} {contract.output_shape}")
    click.echo(f"limits   1 <= tokens <= {manifest.config.context_length}, batch >= 1")
    click.echo(f"versions {json.dumps(manifest.versions)}")
    click.echo(f"weights  {json.dumps(manifest.weights.to_dict())}\n")
    click.echo(table(ARTIFACT_HEADERS, artifact_rows(manifest)) + "\n")
    click.echo(table(["file", "size", "sha256"],
                     [[f, human_size(r.size), r.sha256[:16]] for f, r in manifest.files.items()]))


@cli.command("bench")
@click.option("--preset", default="gpt2-small", show_default=True,
              help="The folder under --artifacts: a preset or the --name of your own export.")
@click.option("--artifacts", "root", type=click.Path(path_type=Path), default=DEFAULT_OUT, show_default=True,
              help="Folder holding <preset>/ (made by `mha export`).")
@click.option("--tokens", default=None,
              help="Comma-separated token counts at batch 1 [default: 16,64,256,1024 up to context_length].")
@click.option("--batches", default=None,
              help="Comma-separated BATCHxTOKENS shapes, or 'none' [default: 8x128,32x16, tokens cut to "
                   "context_length].")
@click.option("--threads", default=None,
              help="Comma-separated thread counts for torch, ONNX Runtime and ExecuTorch alike, each timed in its "
                   "own rounds [default: 1,2 on 2 cores or more, else 1].")
@click.option("--rounds", type=click.IntRange(min=1), default=10, show_default=True, help="Interleaved timing rounds.")
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT / "bench", show_default=True)
@click.option("--only", default="",
              help="Comma-separated runners or decode files to time (the eager wrapper and eager fused always run).")
@click.option("--settle", type=click.FloatRange(min=0.0), default=0.3, show_default=True,
              help="Idle seconds before each timed call, so one runner's threads do not slow the next.")
def bench_cmd(preset: str, root: Path, tokens: str | None, batches: str | None, threads: str | None, rounds: int,
              out: Path, only: str, settle: float) -> None:
    """Latency and tokens/s of every runner side by side, with ratios to the causal floor and to torch's fused
    kernel, and the decode forms; writes JSON and a plot."""
    from mha_export.bench import format_report, parse_batches, parse_counts, parse_threads, run_bench, write_outputs

    parsed: dict[str, Any] = {}
    for name, text, parse in (("--tokens", tokens, parse_counts), ("--batches", batches, parse_batches),
                              ("--threads", threads, parse_threads)):
        try:
            parsed[name] = None if text is None else parse(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=name) from None
    chosen = [name.strip() for name in only.split(",") if name.strip()] or None
    result = run_bench(root / preset, tokens=parsed["--tokens"], batches=parsed["--batches"],
                       threads=parsed["--threads"], rounds=rounds, only=chosen, settle=settle)
    json_path, png_path = write_outputs(result, out)
    click.echo(format_report(result))
    click.echo(f"\nwrote {json_path} and {png_path}")


@cli.command("serve")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--model", default=ONNX.file, show_default=True, help="Which ONNX file of the folder to serve.")
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="Replicas, each one process holding one runner.")
@click.option("--max-batch", type=click.IntRange(min=1), default=16, show_default=True,
              help="Most requests in one ONNX Runtime call (1: no batching).")
@click.option("--batch-wait-ms", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="How long a batch waits to fill; 0 batches what queued while the previous batch ran.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the HTTP proxy listens on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--address", default=None,
              help="Join this Ray cluster (host:port of `ray start --head`); default: start a local Ray instance.")
@click.option("--provider", type=click.Choice(CHOICES), default="cpu", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="Intra-op threads per replica.")
def serve_cmd(artifact_dir: Path, model: str, replicas: int, max_batch: int, batch_wait_ms: float, host: str,
              port: int, address: str | None, provider: str, threads: int) -> None:
    """Serve an artifact over HTTP with Ray Serve (POST /v1/context) until SIGTERM, which drains it."""
    from mha_runtime.serve import ServeOptions, serve

    serve(ServeOptions(artifact=artifact_dir, model=model, replicas=replicas, max_batch=max_batch,
                       batch_wait_ms=batch_wait_ms, host=host, port=port, address=address, provider=provider,
                       threads=threads))


def _int_list(value: str, option: str) -> list[int]:
    try:
        numbers = [int(t) for t in value.split(",") if t.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}", param_hint=option) from None
    if not numbers:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}", param_hint=option)
    return numbers


@cli.command("loadtest")
@click.argument("url")
@click.option("--artifact", "artifact_dir", type=click.Path(path_type=Path), required=True,
              help="The artifact folder the server was started with: every answer is checked against it locally.")
@click.option("--requests", type=click.IntRange(min=1), default=200, show_default=True, help="Requests to send.")
@click.option("--concurrency", type=click.IntRange(min=1, max=256), default=8, show_default=True,
              help="Requests in flight at once (one connection each).")
@click.option("--tokens", default="16,64,256", show_default=True,
              help="Comma-separated token counts, drawn at random per request.")
@click.option("--batch", "batches", default="1", show_default=True,
              help="Comma-separated batch sizes, drawn at random per request.")
@click.option("--format", "fmt", type=click.Choice(["npy", "json"]), default="npy", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--max-seconds", type=click.FloatRange(min=0.1), default=300.0, show_default=True,
              help="No request starts after this.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Also write the figures here.")
def loadtest_cmd(url: str, artifact_dir: Path, requests: int, concurrency: int, tokens: str, batches: str, fmt: str,
                 seed: int, max_seconds: float, json_path: Path | None) -> None:
    """Bounded load on a loopback `mha serve`: throughput, latency percentiles, and every answer checked."""
    from mha_export.atomic import write_file_atomic
    from mha_runtime.loadtest import loadtest, report_lines

    summary = loadtest(url, artifact_dir, requests=requests, concurrency=concurrency,
                       tokens=_int_list(tokens, "--tokens"), batches=_int_list(batches, "--batch"), fmt=fmt,
                       seed=seed, max_seconds=max_seconds)
    for line in report_lines(summary):
        click.echo(line)
    if json_path is not None:
        write_file_atomic(json_path, (json.dumps(summary, indent=2) + "\n").encode())
    if summary["errors"] or summary["not_sent"]:
        click.echo(f"load test failed: {summary['errors']} error(s), {summary['not_sent']} request(s) not sent",
                   err=True)
        sys.exit(1)


@cli.command("triton")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--out", "repo", type=click.Path(path_type=Path), required=True,
              help="The model repository; other models already in it are left alone.")
@click.option("--name", default=None, help="Model name prefix (default: the artifact's name).")
@click.option("--model", default=ONNX.file, show_default=True, help="Which ONNX file of the folder.")
@click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True,
              help="max_batch_size of both configs.")
def triton_cmd(artifact_dir: Path, repo: Path, name: str | None, model: str, max_batch: int) -> None:
    """Write a Triton Inference Server model repository: <name>_onnx and <name>_torchscript."""
    from mha_export.atomic import staged_folder
    from mha_runtime.triton import triton_models

    models = triton_models(artifact_dir, name=name, model=model, max_batch=max_batch)
    for triton_model in models:  # each model folder swapped in whole, only once written
        with staged_folder(repo / triton_model.name) as stage:
            triton_model.write(stage)
        click.echo(f"wrote {repo / triton_model.name} ({triton_model.platform}, {triton_model.input_name} -> "
                   f"{triton_model.output_name})")
    click.echo(f"serve it elsewhere with: tritonserver --model-repository={repo.resolve()}")


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM unwinds like Ctrl-C: staging folders are removed, nothing half-written


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    cli.main(prog_name="mha")
