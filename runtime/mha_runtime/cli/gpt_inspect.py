"""`mha inspect` on a GPT folder: config, versions, weights, every decoder form with how it was judged (a lossy
form: its quality beside fp32 and its quantization plan), and the files."""
from __future__ import annotations

import json
from pathlib import Path

import click

from mha_runtime.cli.tables import human_size, shown, table
from mha_runtime.gpt.manifest import GPTArtifact, GPTManifest, load_gpt_manifest

HEADERS = ["artifact", "dtype", "size", "cases", "max abs err (eager)", "greedy agreement", "mean KL (p99)",
           "same top token", "kept higher"]


def _row(file: str, a: GPTArtifact, manifest: GPTManifest) -> list[str]:
    size = human_size(manifest.files[file].size) if file in manifest.files else "-"
    q, plan = a.quality or {}, a.quantization or {}
    kl = f"{q['mean_kl']:.2e} ({q['p99_kl']:.2e})" if "mean_kl" in q and "p99_kl" in q else "-"
    same = f"{100 * q['same_top']:.1f}%" if "same_top" in q else "-"
    kept = plan.get("kept")
    return [file, shown(a.dtype), size, str(a.cases), f"{a.max_abs_error:.2e}", f"{a.greedy_agreement:.2f}", kl, same,
            "-" if kept is None else str(len(kept))]


def inspect_gpt(folder: Path, *, as_json: bool) -> None:
    manifest = load_gpt_manifest(folder)
    if as_json:
        click.echo(json.dumps(manifest.to_dict(), indent=2))
        return
    c = manifest.config
    click.echo(f"name     {shown(manifest.name)} (GPT)  created {shown(manifest.created)}")
    click.echo(f"config   {json.dumps(c.to_dict())}")
    click.echo(f"limits   1 <= prompt + new tokens <= {c.context_length}, token ids 0..{c.vocab_size - 1}")
    click.echo(f"versions {json.dumps(manifest.versions)}")
    click.echo(f"weights  {json.dumps(manifest.weights)}")
    tokenizer = "none (token ids only)" if manifest.tokenizer is None else json.dumps(manifest.tokenizer)
    click.echo(f"tokenizer {tokenizer}  eos_id {manifest.eos_id}\n")
    click.echo(table(HEADERS, [_row(f, a, manifest) for f, a in manifest.artifacts.items()]) + "\n")
    for file, a in manifest.artifacts.items():
        if a.quality is not None:
            bar = a.quality.get("bar_mean_kl")
            plan = a.quantization or {}
            level = "" if plan.get("accuracy_level") is None else f", accuracy level {plan.get('accuracy_level')}"
            symmetric = plan.get("symmetric")
            sym = "" if symmetric is None else ", symmetric" if symmetric else ", asymmetric"
            finer = ", ".join(f"{k} ({v})" for k, v in (plan.get("finer") or {}).items()) or "none"
            kept = ", ".join(f"{k} ({v})" for k, v in (plan.get("kept") or {}).items()) or "none"
            # shown(): the manifest's own values, escaped where an edit put a newline in them (it would forge a line)
            click.echo(shown(f"{file}: mean KL divergence from fp32 {a.quality.get('mean_kl', float('nan')):.3g} "
                             f"(bar {bar}) over {a.quality.get('positions')} positions; {plan.get('bits')} bits, "
                             f"blocks of {plan.get('block_size')}{sym}{level}; in smaller blocks: {finer}; kept at a "
                             f"higher precision: {kept}"))
    click.echo("\n" + table(["file", "size", "sha256"],
                            [[f, human_size(r.size), r.sha256[:16]] for f, r in manifest.files.items()]))
