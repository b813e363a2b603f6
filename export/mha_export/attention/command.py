"""The attention's row of the export kinds (mha_export.kinds): `mha export` resolved and refused before any work,
then exported; `mha validate` and `mha bench` of an attention folder."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import click

from mha_export.kinds import EXPORT_KINDS, BenchRequest, ExportRequest, Job, resolve_jobs
from mha_runtime.artifact.errors import MHAError
from mha_runtime.artifact.manifest import ATTENTION_KIND
from mha_runtime.attention.config import PRESETS, MHAConfig
from mha_runtime.attention.registry import ALL, Selection, buildable, parse_variants


def attention_preset(name: str) -> MHAConfig:
    """The preset `name`; an unknown one is a bad --preset, naming the kind that has it."""
    if name not in PRESETS:
        raise click.BadParameter(f"{name!r} is not one of {', '.join(map(repr, PRESETS))}"
                                 + EXPORT_KINDS[ATTENTION_KIND].elsewhere(name), param_hint="'--preset'")
    return PRESETS[name]


def prepare_export(request: ExportRequest) -> Callable[[], None]:
    """Refuse everything the flags, configs and weights path can tell, for every job, before any work; the work."""
    from mha_export.pipeline.budget import check_budget
    from mha_export.pipeline.preflight import check_opset
    from mha_export.pipeline.run import check_folder_name
    from mha_runtime.artifact.atomic import check_folder_target

    try:  # registry names, or 'all' / 'none'; a bad name is a usage error
        selection = parse_variants(request.variants or ALL)
    except MHAError as exc:
        raise click.BadParameter(str(exc)) from None
    if request.layer is not None and request.weights is None:
        raise click.UsageError("--layer picks a block of --weights: give --weights FILE")
    check_opset(request.opset)
    jobs = resolve_jobs(EXPORT_KINDS[ATTENTION_KIND], request, preset=attention_preset,
                        read_config=lambda path, flag: MHAConfig.from_file(path, flag=flag))
    for job in jobs:
        check_folder_name(job.folder)
        check_folder_target(Path(request.out) / job.folder)
        check_budget(job.config)
        buildable(job.config, selection)
    return partial(_export, request, jobs, selection)


def _export(request: ExportRequest, jobs: list[Job[MHAConfig]], selection: Selection) -> None:
    from mha_export.attention.pipeline.export import export_preset  # torch: imported once nothing is left to refuse
    from mha_runtime.cli.tables import ARTIFACT_HEADERS, artifact_rows, table

    out = Path(request.out)
    rows, notes = [], []
    for job in jobs:
        def announce(folder: str = job.folder) -> None:  # once the weights are read: every refusal is behind
            click.echo(f"exporting {folder} ...", err=True)

        result = export_preset(job.folder, out, config=job.config, weights=request.weights, layer=request.layer,
                               opset=request.opset, progress=True, variants=selection, announce=announce)
        rows += artifact_rows(result.manifest)
        click.echo(f"  {job.folder}: done in {result.seconds:.1f} s", err=True)
        notes += [f"{job.folder}: {note}" for note in result.notes]
    click.echo(table(ARTIFACT_HEADERS, rows))
    click.echo("artifacts in " + ", ".join(str(out / job.folder) for job in jobs))
    for note in dict.fromkeys(notes):  # last, so that what was left out and how to add it is what one reads
        click.echo(f"note: {note}", err=True)


def validate_folder(folder: Path) -> None:
    """Every artifact against the eager wrapper rebuilt from the folder, over the export's whole sweep."""
    from mha_export.attention.pipeline.revalidate import revalidate
    from mha_runtime.cli.tables import table

    reports = revalidate(folder, progress=True)  # raises ValidationError listing every failure
    rows = [[f, r.cases, f"{r.max_abs:.2e}", f"{r.rel_l2:.2e}", f"atol {r.spec.tolerance.atol:g}"]
            for f, r in reports.items()]
    click.echo(table(["artifact", "cases", "max abs err", "rel L2 err", "tolerance"], rows))
    click.echo(f"{sum(r.cases for r in reports.values())} passed, 0 failed")


def bench_folder(request: BenchRequest) -> None:
    """Every runner of the folder timed side by side; the report, its JSON and its plot."""
    from mha_export.bench.report import check_out_dir, format_report, write_outputs
    from mha_export.bench.run import run_bench

    check_out_dir(request.out)  # before the rounds, which may take minutes
    result = run_bench(request.folder, tokens=request.tokens, batches=request.batches, threads=request.threads,
                       rounds=request.rounds, only=request.only, settle=request.settle)
    written = write_outputs(result, request.out)
    click.echo(format_report(result))
    if written.note is not None:
        click.echo(f"note: {written.note}")
    click.echo(f"\nwrote {written.json_path}" + ("" if written.png_path is None else f" and {written.png_path}"))
