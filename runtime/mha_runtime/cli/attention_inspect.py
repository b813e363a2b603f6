"""`mha inspect` on an attention folder: contract, config, versions, weights, every artifact with its validation
results, and the files."""
from __future__ import annotations

import json
from pathlib import Path

import click

from mha_runtime.attention.contract import DTYPE, INPUT_NAME, OUTPUT_NAME, IOContract
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.cli.tables import ARTIFACT_HEADERS, artifact_rows, human_size, shown, table


def inspect_attention(folder: Path, *, as_json: bool) -> None:
    manifest = load_manifest(folder)
    if as_json:
        click.echo(json.dumps(manifest.to_dict(), indent=2))
        return
    contract = IOContract(manifest.config)
    click.echo(f"name     {shown(manifest.name)}  opset {manifest.opset}  created {shown(manifest.created)}")
    click.echo(f"config   {manifest.config.to_json()}")
    click.echo(f"input    {INPUT_NAME} {DTYPE} {contract.input_shape}")
    click.echo(f"output   {OUTPUT_NAME} {DTYPE} {contract.output_shape}")
    click.echo(f"limits   1 <= tokens <= {manifest.config.context_length}, batch >= 1")
    click.echo(f"versions {json.dumps(manifest.versions)}")
    click.echo(f"weights  {json.dumps(manifest.weights.to_dict())}\n")
    click.echo(table(ARTIFACT_HEADERS, artifact_rows(manifest)) + "\n")
    click.echo(table(["file", "size", "sha256"],
                     [[f, human_size(r.size), r.sha256[:16]] for f, r in manifest.files.items()]))
