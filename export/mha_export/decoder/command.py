"""The decoder's row of the export kinds (mha_export.kinds): `mha export --gpt` resolves config, weights and
tokenizer from the flags, refuses before work, exports and reports; `mha validate` of a decoder folder."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import click

from mha_export.decoder.archs import arch_named, arch_of, hf_arch
from mha_export.decoder.archs.gpt2.config import gpt_preset
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.checkpoint import Origin, checkpoint_config, gguf_origin, origin_for, read_config
from mha_export.gguf.source import check_types, is_gguf, metadata
from mha_export.kinds import CHECKPOINT, EXPORT_KINDS, ExportRequest, Job, resolve_jobs
from mha_runtime.artifact.errors import BadValueError, ConfigError, ValidationError
from mha_runtime.artifact.manifest import DECODER_KIND

# --weights with neither --preset nor --config nor a config.json beside it: the default preset would rarely fit.
WEIGHTS_ALONE = ("--weights needs --config gpt.json (the book's GPT config keys), a config.json beside the checkpoint, "
                 "or --preset")


def decoder_preset(name: str) -> DecoderConfig:
    """The preset `name`; an unknown one is one line naming the presets there are (and the kind that has it)."""
    try:
        return gpt_preset(name)
    except BadValueError as exc:
        raise BadValueError(f"{exc}{EXPORT_KINDS[DECODER_KIND].elsewhere(name)}") from None


def decoder_jobs(request: ExportRequest) -> list[Job[DecoderConfig]]:
    """(folder name, config, source) per job, by the rules both kinds share (mha_export.kinds.resolve_jobs). A
    Hugging Face checkpoint's config.json beside --weights stands in for --config; a config the user named that
    disagrees with it is refused."""
    named = None if request.arch is None else arch_named(request.arch).NAME  # unknown: its line, exit 2
    jobs = resolve_jobs(EXPORT_KINDS[DECODER_KIND], request, preset=decoder_preset,
                        read_config=partial(_read_config, arch=named), beside=checkpoint_config,
                        weights_alone=WEIGHTS_ALONE)
    for job in jobs:
        if named is not None and job.config.arch != named:  # what came with the config or weights names another
            raise click.BadParameter(f"{named} disagrees with {job.source} ({job.config.arch}); drop --arch or give "
                                     f"a config of {named}", param_hint="'--arch'")
        if job.source.startswith("--"):  # named by the user: --config or --preset (not the checkpoint's own)
            check_beside(job.config, job.source, request.weights)
    if request.context_length is None:
        return jobs
    return [replace(job, config=shorter(job.config, request.context_length, job.source)) for job in jobs]


def shorter(config: DecoderConfig, context: int, source: str) -> DecoderConfig:
    """The config with `context` cache rows: at most the model's own, and only where no weight's shape depends on
    it (rotary positions; learned ones are a (context, width) matrix of the weights)."""
    if context > config.context_length:
        raise click.BadParameter(f"{context} is more than the model's context {config.context_length} "
                                 f"({source}); expected at most that", param_hint="'--context-length'")
    cut = replace(config, context_length=context)  # type: ignore[type-var]
    arch = arch_of(config)
    if arch.book_shapes(cut) != arch.book_shapes(config):
        raise click.BadParameter(f"the {arch.NAME} model's positions are learned weights for "
                                 f"{config.context_length} tokens ({source}); expected no --context-length",
                                 param_hint="'--context-length'")
    return cut


def resolve_config(presets: tuple[str, ...], config_path: Path | None, name: str | None,
                   weights: Path | None) -> list[tuple[str, DecoderConfig]]:
    """(folder name, config) per job: decoder_jobs of these flags."""
    request = ExportRequest(presets=presets, config_path=config_path, name=name, weights=weights)
    return [(job.folder, job.config) for job in decoder_jobs(request)]


# Fields of a Hugging Face config.json given as --config that the folder carries besides the shapes: one that
# disagrees with the checkpoint's own would change where generation stops.
CARRIED_IDS = ("eos_token_id", "bos_token_id")


def _read_config(path: Path, flag: str, arch: str | None = None) -> DecoderConfig:
    """The decoder config in `path` (a Hugging Face config.json's model_type, a GGUF's general.architecture, the
    book's keys or `arch` (--arch) name its architecture). The checkpoint's own config.json, which the user did not
    name: a file that is not JSON or has a duplicate key is a bad file (exit 1) alike; a value the architecture
    cannot take stays exit 2."""
    return read_config(path, flag=flag, own=flag == CHECKPOINT, arch=arch)


def check_beside(config: DecoderConfig, source: str, weights: Path | None) -> None:
    """Refuse a config that disagrees with the checkpoint's own config.json beside --weights, field by field: the
    shapes cannot tell n_heads, and a wrong head count gives a silently wrong model."""
    own_path = checkpoint_config(weights)
    named = Path(source.removeprefix("--config ")) if source.startswith("--config ") else None
    if own_path is None or (named is not None and own_path.resolve() == named.resolve()):  # that very file, by path
        return
    try:
        own = _read_config(own_path, CHECKPOINT)
    except ConfigError as exc:  # a file the user did not name: a bad file, exit 1, whatever is wrong in it
        raise ConfigError(str(exc)) from None
    if config.arch != own.arch:
        raise click.BadParameter(
            f"arch {config.arch} disagrees with the checkpoint's {own_path} ({own.arch}); export with that config "
            f"(drop {source.split()[0]}) or give weights it fits", param_hint=f"'{source.split()[0]}'")
    for field, hf_name in arch_of(own).HF_DECIDED.items():
        mine, theirs = getattr(config, field), getattr(own, field)
        if mine != theirs:
            raise click.BadParameter(
                f"{field} {_show(mine)} disagrees with the checkpoint's {own_path} ({hf_name.split()[0]} "
                f"{_show(theirs)}); export with that config (drop {source.split()[0]}) or give weights it fits",
                param_hint=f"'{source.split()[0]}'")
    mine_doc = None if named is None else _hf_doc(named, "--config")
    if mine_doc is not None:  # a Hugging Face config.json elsewhere: the ids it would carry into the folder
        own_doc = (gguf_origin(own_path, own).generation if is_gguf(own_path)  # a GGUF's ids
                   else _hf_doc(own_path, CHECKPOINT)) or {}
        for key in CARRIED_IDS:
            if mine_doc.get(key) != own_doc.get(key):
                raise click.BadParameter(
                    f"{key} {json.dumps(mine_doc.get(key))[:40]} disagrees with the checkpoint's {own_path} "
                    f"({json.dumps(own_doc.get(key))[:40]}); export with that config (drop --config) or give weights "
                    "it fits", param_hint="'--config'")


def _hf_doc(path: Path, flag: str) -> dict[str, Any] | None:
    """The JSON object of a Hugging Face config.json (one an architecture recognises), or None for the book's
    keys."""
    from mha_export.decoder.checkpoint import read_json

    doc = read_json(path, flag)
    return doc if hf_arch(doc) is not None else None


def _show(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _tokenizer_source(tokenizer: Path | None, weights: Path | None) -> tuple[Path | None, str | None]:
    """The tokenizer to build from and, when a checkpoint's tokenizer.json is beside the weights, the line that says
    which was taken: save_pretrained's tokenizer.json is taken as its config.json is; --tokenizer wins."""
    from mha_export.decoder.checkpoint import beside_tokenizer

    if tokenizer is None and weights is not None and is_gguf(weights):  # the file's own, where it holds one
        said = metadata(weights).get("tokenizer.ggml.model")
        if said in (None, "none"):
            return None, None
        return weights, f"the GGUF's own ({weights}: tokenizer.ggml.{said}; --tokenizer takes another)"
    found = beside_tokenizer(weights)
    if found is None:
        return tokenizer, None
    if tokenizer is not None:
        return tokenizer, f"--tokenizer {tokenizer} (not the checkpoint's {found})"
    # its folder: the tokenizer_config.json save_pretrained wrote with it is taken too, as --tokenizer FOLDER takes it
    return found.parent, f"the checkpoint's {found} (beside the weights; --tokenizer takes another)"


def prepare_export(request: ExportRequest) -> Callable[[], None]:
    """Refuse everything the flags, configs, weights path and tokenizer can tell, for every job, before any work;
    the work."""
    from mha_export.decoder.plan import check_gpt_budget, check_gpt_forms, parse_gpt_variants
    from mha_export.decoder.tokenizer import read_tokenizer
    from mha_export.pipeline.run import check_folder_name
    from mha_runtime.artifact.atomic import check_folder_target

    chosen = parse_gpt_variants(request.variants)
    jobs = decoder_jobs(request)
    if request.weights is not None and is_gguf(request.weights):
        check_types(request.weights)  # a tensor type the export cannot dequantize: before any work
    tokenizer, told = _tokenizer_source(request.tokenizer, request.weights)
    for job in jobs:
        check_folder_name(job.folder)  # everything that can be refused, before any work
        check_folder_target(Path(request.out) / job.folder)
        try:
            check_gpt_budget(job.config)
            check_gpt_forms(job.config, chosen)
        except ConfigError as exc:  # the file or preset the values came from, first
            raise type(exc)(f"{job.source}: {exc}") from None
        if tokenizer is not None:
            read_tokenizer(tokenizer, vocab_size=job.config.vocab_size, context_length=job.config.context_length,
                           flag="--tokenizer" if told is None or told.startswith("--") else CHECKPOINT)
    # eos ids and generation defaults
    origins = {job.folder: origin_for(job.config, request.weights, request.config_path) for job in jobs}
    return partial(_export, request, jobs, chosen, tokenizer, told, origins)


def _export(request: ExportRequest, jobs: list[Job[DecoderConfig]], chosen: tuple[str, ...],
            tokenizer: Path | None, told: str | None, origins: dict[str, Origin]) -> None:
    from mha_export.decoder.export import export_gpt  # torch: imported once nothing is left to refuse
    from mha_runtime.cli.tables import table

    for job in jobs:
        def announce(folder: str = job.folder, config: DecoderConfig = job.config) -> None:  # the weights are read
            click.echo(f"exporting {folder} ({config.arch}, {config.n_layers} layers, "
                       f"{config.parameters(tied=False):,} parameters at most) ...", err=True)

        result = export_gpt(job.folder, request.out, config=job.config, weights=request.weights, tokenizer=tokenizer,
                            variants=chosen, progress=True, announce=announce, origin=origins[job.folder])
        rows = [[f, a.dtype, f"{result.manifest.files[f].size / 1e6:.1f} MB", a.cases, f"{a.max_abs_error:.2e}",
                 f"{a.greedy_agreement:.2f}", "-" if a.quality is None else f"{a.quality['mean_kl']:.2e}",
                 f"{a.export_seconds:.1f} s"]
                for f, a in result.manifest.artifacts.items()]
        click.echo(table(["artifact", "dtype", "size", "cases", "max abs err", "greedy agreement", "mean KL",
                          "build"], rows))
        for note in result.notes:
            click.echo(f"note: left out {note}", err=True)
        for note in origins[job.folder].notes:  # generation defaults the runtimes do not apply
            click.echo(f"note: {note}", err=True)
        if told is not None:
            click.echo(f"tokenizer: {told}", err=True)
        if result.manifest.tokenizer is None:
            click.echo(f"note: {job.folder} has no tokenizer (no --tokenizer): it works on token ids", err=True)
        click.echo(f"  {job.folder}: done in {result.seconds:.1f} s; artifacts in {result.folder}", err=True)


def validate_folder(folder: Path) -> None:
    """Every fp32 form against the eager model rebuilt from the folder's config and gpt.safetensors, each lossy
    form's quality against its bar; a table, then `N passed, N failed` (ValidationError on a failure)."""
    from mha_export.decoder.revalidate import report_lines, revalidate

    result = revalidate(folder, progress=True)
    for note in result.not_rerun:
        click.echo(f"note: {note}", err=True)
    click.echo("\n".join(report_lines(result)))
    if result.failures:
        raise ValidationError(result.failures)
