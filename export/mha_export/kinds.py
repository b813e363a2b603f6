"""The export package's table of model kinds, beside the runtime's (mha_runtime.kinds): per kind, the `mha export`
flags only it takes, its presets, how it refuses a request before any work and exports it, how `mha validate`
reruns its validation and how `mha bench` times it. `--gpt` selects the decoder row; `mha validate` and `mha bench`
look the kind of the folder up (its manifest says it).

The rules both kinds share (preset, config, name and weights) are `resolve_jobs`, written once. Each target is
named by a loader, a small function that imports it when called and returns it: looking a kind up imports no torch
(a refusal is one line in the time the interpreter takes to start), and mypy, editors and
tests/commands/test_kinds.py follow every name."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

import click

from mha_export.decoder.archs.gpt2.config import GPT_PRESETS
from mha_runtime.artifact.manifest import ATTENTION_KIND, DECODER_KIND
from mha_runtime.attention.config import PRESETS
from mha_runtime.kinds import KINDS as RUNTIME_KINDS
from mha_runtime.kinds import kind_of

if TYPE_CHECKING:
    from mha_export.bench.options import Shape

C = TypeVar("C")
T = TypeVar("T")


@dataclass(frozen=True)
class ExportRequest:
    """The flags of `mha export`, as given."""

    presets: tuple[str, ...] = ()
    config_path: Path | None = None
    name: str | None = None
    out: Path = Path("artifacts")
    weights: Path | None = None
    variants: str | None = None
    layer: int | None = None
    opset: int = 18
    tokenizer: Path | None = None
    arch: str | None = None
    context_length: int | None = None


@dataclass(frozen=True)
class Job(Generic[C]):
    """One folder to export: its name under --out, its config, and where the values came from (the start of a line
    that refuses them)."""

    folder: str
    config: C
    source: str


@dataclass(frozen=True)
class BenchRequest:
    """The flags of `mha bench`, parsed."""

    folder: Path
    out: Path
    tokens: list[int] | None
    batches: list[Shape] | None
    threads: list[int] | None
    rounds: int
    only: list[str] | None
    settle: float


Preparer = Callable[[ExportRequest], Callable[[], None]]  # refuses everything before work; returns the work
Validator = Callable[[Path], None]  # prints the table; raises ValidationError on a failure
Bencher = Callable[[BenchRequest], None]


@dataclass(frozen=True)
class ExportKind:
    """One kind's row: what `mha export` of it takes and does, and its targets for the folder commands."""

    name: str  # the runtime's kind of the folders it makes (mha_runtime.kinds)
    flag: str | None  # the `mha export` flag that selects it; None: the kind without one
    title: str  # how a line names it
    own_flags: Mapping[str, str]  # `mha export` flags only this kind takes -> the line when another kind is given one
    presets: Mapping[str, object]
    default_presets: tuple[str, ...]  # exported when neither --preset nor --config is given
    preparer: Callable[[], Preparer]
    validator: Callable[[], Validator]
    bencher: Callable[[], Bencher] | None = None

    def loaders(self) -> dict[str, Callable[[], object]]:
        """Every target of the row by command; the absent ones left out."""
        named = {"export": self.preparer, "validate": self.validator, "bench": self.bencher}
        return {what: loader for what, loader in named.items() if loader is not None}

    def needs(self, loader: Callable[[], T] | None, command: str, folder: Path) -> T:
        """`loader`'s target, or the kind's one line naming what it offers when it has none for `command`."""
        return RUNTIME_KINDS[self.name].needs(loader, command, folder)

    def takes(self, flag: str) -> bool:
        """Whether `mha export` of this kind takes `flag` (one no row owns is every kind's)."""
        return all(flag not in other.own_flags for other in EXPORT_KINDS.values() if other is not self)

    def prepare(self, request: ExportRequest, given: Iterable[str]) -> Callable[[], None]:
        """Refuse the flags of other kinds (`given`: the flags on the command line) and everything the kind's own
        rules refuse, before any work; the work."""
        for flag in given:
            if not self.takes(flag):  # the line of the row that owns it
                raise click.UsageError(next(k.own_flags[flag] for k in EXPORT_KINDS.values() if flag in k.own_flags))
        variants = request.variants
        if variants is not None and not variants.replace(",", "").strip():  # not 'all' or 'none' by accident
            raise click.BadParameter("expected comma-separated variants, got none", param_hint="'--variants'")
        return self.preparer()(request)

    def elsewhere(self, preset: str) -> str:
        """' (a decoder preset: add --gpt)' for a preset of another kind, else ''."""
        for other in EXPORT_KINDS.values():
            if other is not self and preset in other.presets:
                how = f"add {other.flag}" if other.flag is not None else f"drop {self.flag}"
                return f" (a{'n' if other.title[0] in 'aeiou' else ''} {other.title} preset: {how})"
        return ""


def resolve_jobs(kind: ExportKind, request: ExportRequest, *, preset: Callable[[str], C],
                 read_config: Callable[[Path, str], C], beside: Callable[[Path | None], Path | None] | None = None,
                 weights_alone: str | None = None) -> list[Job[C]]:
    """The folders to export, by the rules both kinds share; the flags' own refusals (exit 2) first, then the
    weights path (a bad file, exit 1), checked once here for both kinds. `preset`: the kind's preset by name (an
    unknown one is its line); `read_config(path, flag)`: a config file; `beside(weights)`: a config file beside the
    checkpoint that stands in for --config when neither --preset nor --config is given; `weights_alone`: the line
    for --weights with neither (None: the default presets)."""
    presets, config_path, name, weights = request.presets, request.config_path, request.name, request.weights
    for p in presets:
        preset(p)
    if config_path is not None and presets:
        raise click.UsageError("--preset and --config exclude each other: export a preset or your own config")
    names = list(presets) or list(kind.default_presets)
    if config_path is None and (weights is not None or name is not None) and len(names) != 1:
        raise click.UsageError(f"--weights and --name fit one preset; got {len(names)} ({', '.join(names)}): "
                               "add --preset NAME")
    if config_path is not None:
        if name is None:
            raise click.UsageError("--config needs --name NAME (the folder under --out)")
        config = read_config(config_path, "--config")
        _check_weights(weights)
        return [Job(name, config, f"--config {config_path}")]
    _check_weights(weights)
    found = beside(weights) if beside is not None and not presets else None
    if found is not None:
        if name is None:
            raise click.UsageError(f"the checkpoint's {found} stands in for --config: it needs --name NAME (the "
                                   "folder under --out)")
        return [Job(name, read_config(found, CHECKPOINT), str(found))]
    if weights is not None and not presets and weights_alone is not None:
        raise click.UsageError(weights_alone)
    return [Job(n if name is None else name, preset(n), f"--preset {n}") for n in names]  # '' is refused later


CHECKPOINT = "the checkpoint's"  # the flag a config file beside the weights is read under: the user named none


def _check_weights(weights: Path | None) -> None:
    """Nothing there, a folder, a device: said as such, before what the file would stand for (once per path)."""
    from mha_export.pipeline.preflight import check_weights_path

    if weights is not None:
        check_weights_path(weights)


def selected(given: Iterable[str]) -> ExportKind:
    """The row `mha export` exports with: the one whose flag is among `given` (the flags on the command line: --gpt
    selects the decoder's), else the one no flag selects."""
    flags = set(given)
    return next((kind for kind in EXPORT_KINDS.values() if kind.flag in flags),
                next(kind for kind in EXPORT_KINDS.values() if kind.flag is None))


def export_row(folder: Path) -> ExportKind:
    """The export row of the folder's kind (its manifest says it)."""
    return EXPORT_KINDS[kind_of(folder).name]


def _attention_export() -> Preparer:
    from mha_export.attention.command import prepare_export
    return prepare_export


def _attention_validate() -> Validator:
    from mha_export.attention.command import validate_folder
    return validate_folder


def _attention_bench() -> Bencher:
    from mha_export.attention.command import bench_folder
    return bench_folder


def _decoder_export() -> Preparer:
    from mha_export.decoder.command import prepare_export
    return prepare_export


def _decoder_validate() -> Validator:
    from mha_export.decoder.command import validate_folder
    return validate_folder


EXPORT_KINDS: dict[str, ExportKind] = {
    ATTENTION_KIND: ExportKind(
        ATTENTION_KIND, None, "attention",
        {"--layer": "--layer picks one attention layer; --gpt exports every layer",
         # not ignored: gpt.onnx was silently built at its own opset whatever was asked for
         "--opset": "--opset sets the attention's mha.onnx; --gpt builds its forms at their own opset"},
        PRESETS, tuple(PRESETS), _attention_export, _attention_validate, _attention_bench),
    DECODER_KIND: ExportKind(
        DECODER_KIND, "--gpt", "decoder", {"--tokenizer": "--tokenizer belongs to a GPT export: add --gpt",
                                           "--arch": "--arch names a decoder's architecture: add --gpt",
                                           "--context-length": "--context-length sets a decoder's cache rows: add "
                                                               "--gpt"},
        GPT_PRESETS, ("gpt-mini",), _decoder_export, _decoder_validate),
}
