"""The attention folder's export: its steps in the one pipeline (mha_export.pipeline.run), each a function of the
step before it (Plan -> Loaded -> Built -> Validated -> the manifest), and its builder table (the weights, one row
per variant, the offline-optimized copies, the golden fixtures)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

import numpy as np
import torch

from mha_export.attention.graphs.table import BUILDERS
from mha_export.attention.pipeline.fixtures import write_golden
from mha_export.attention.pipeline.seal import artifact_facts, attention_manifest
from mha_export.attention.pipeline.validate import (
    SWEEP_SEEDS,
    ArtifactReport,
    SweepCase,
    sweep_cases,
    sweep_shapes,
    validate,
)
from mha_export.attention.pipeline.write_optimized import optimized_records, write_optimized
from mha_export.attention.weights.load import load_model
from mha_export.pipeline.budget import check_budget
from mha_export.pipeline.builders import FileRow, always, write_files, write_weights
from mha_export.pipeline.preflight import DEFAULT_OPSET, check_opset
from mha_export.pipeline.run import ExportResult, Sealed, Stage, run_export
from mha_runtime.artifact.errors import ConfigError
from mha_runtime.attention.config import MHAConfig, preset
from mha_runtime.attention.golden import GOLDEN_DIR
from mha_runtime.attention.manifest import WeightsRecord
from mha_runtime.attention.optimized_records import OPTIMIZED_DIR, is_copy
from mha_runtime.attention.registry import (
    ALL,
    EXECUTORCH_RUNTIME,
    PTE_MAX_BATCH,
    VARIANTS,
    WEIGHTS_FILE,
    ArtifactSpec,
    Selection,
    Variant,
    artifact_specs,
    buildable,
    with_needs,
)

# {provider: {plain file: its optimized copy's spec}} (write_optimized)
Copies = Mapping[str, Mapping[str, ArtifactSpec]]


@dataclass(frozen=True)
class Plan:
    """What the export will build, every refusal passed: the config, the chosen variants and everything they are
    built from (registry order), their files, and what the default set left out."""

    name: str
    config: MHAConfig
    opset: int
    weights: Path | None
    layer: int | None
    builds: tuple[Variant, ...]  # the core pair, the chosen variants and their needs
    artifacts: tuple[ArtifactSpec, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Loaded:
    """The eager wrapper with its weights, their record, and the sweep's eager outputs every file is judged by."""

    plan: Plan
    model: torch.nn.Module
    weights: WeightsRecord
    sweep: tuple[SweepCase, ...]


@dataclass(frozen=True)
class Built:
    """The staged files: the wrapper they were built from (validation reruns nothing else of it), the copies,
    and each artifact file's build time."""

    loaded: Loaded
    copies: Copies = field(default_factory=lambda: MappingProxyType({}))
    seconds: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Validated:
    """Every staged file judged over the sweep, each copy's report under its own file name."""

    built: Built
    reports: Mapping[str, ArtifactReport]


def _weights(loaded: Loaded, built: Built, folder: Path) -> Built:
    write_weights(folder / WEIGHTS_FILE, loaded.model.state_dict())
    return built


def _variant_row(variant: str) -> FileRow[Loaded, Built]:
    """The row of one variant: its builder (mha_export.attention.graphs.table) when the plan builds it."""
    def write(loaded: Loaded, built: Built, folder: Path) -> Built:
        plan = loaded.plan
        BUILDERS[variant](loaded.model, plan.config, folder, opset=plan.opset)
        return built

    return FileRow(variant, lambda loaded: any(v.name == variant for v in loaded.plan.builds), write)


def _copies(loaded: Loaded, built: Built, folder: Path) -> Built:
    return replace(built, copies=write_optimized(folder, loaded.plan.artifacts))


def _golden(loaded: Loaded, built: Built, folder: Path) -> Built:
    write_golden(loaded.model, loaded.plan.config, folder, loaded.plan.artifacts)
    return built


# The attention's builder table, in build order: the weights, every variant in registry order (a variant's needs
# come before it), ONNX Runtime's optimized copies of the files built, the golden fixtures over every file.
FILES: tuple[FileRow[Loaded, Built], ...] = (
    FileRow(WEIGHTS_FILE, always, _weights),
    *(_variant_row(name) for name in VARIANTS),
    FileRow(OPTIMIZED_DIR, always, _copies),
    FileRow(GOLDEN_DIR, always, _golden),
)


@dataclass(frozen=True)
class AttentionExport:
    """The attention folder's steps in the one pipeline: the seed's weights or one layer of `weights`, every
    builder its variants need, the offline-optimized copies, the golden fixtures, the sweep, the manifest."""

    name: str
    config: MHAConfig | None
    weights: Path | None
    layer: int | None
    opset: int
    variants: Selection

    def plan(self) -> Plan:
        config = self.config or preset(self.name)
        check_opset(self.opset)
        check_budget(config)
        variants, notes = buildable(config, self.variants)
        return Plan(self.name, config, self.opset, self.weights, self.layer, builds=with_needs(variants),
                    artifacts=artifact_specs(variants), notes=tuple(notes))

    @staticmethod
    def load(plan: Plan) -> Loaded:
        model, weights = load_model(plan.config, plan.weights, layer=plan.layer)
        # Computed before the work: finite weights can still overflow float32 attention scores, and every artifact
        # would then fail the sweep with a line blaming the input (it was found only after all of the builds).
        sweep = tuple(sweep_cases(model, plan.config))
        if not all(np.isfinite(expected).all() for _, expected, _ in sweep):
            raise ConfigError("weights: eager PyTorch's output is NaN or inf with these weights (their values overflow "
                              "float32 attention scores); no exported artifact could be checked against it")
        return Loaded(plan, model, weights, sweep)

    @staticmethod
    def build(loaded: Loaded, stage: Stage) -> Built:
        written = write_files(FILES, loaded, Built(loaded), stage)
        # A variant of several files records its whole build time on each.
        seconds = {spec.file: written.seconds[v.name] for v in loaded.plan.builds for spec in v.artifacts}
        return replace(written.made, seconds=MappingProxyType(seconds))

    @staticmethod
    def validate(built: Built, stage: Stage) -> Validated:
        loaded = built.loaded
        copies = (spec for by_source in built.copies.values() for spec in by_source.values())
        reports = validate(stage.folder, loaded.model, loaded.plan.config, (*loaded.plan.artifacts, *copies),
                           progress=stage.progress, label=stage.label, sweep=loaded.sweep)
        return Validated(built, MappingProxyType(reports))

    @staticmethod
    def seal(validated: Validated, folder: Path) -> Sealed:
        built = validated.built
        loaded = built.loaded
        plan = loaded.plan
        manifest = attention_manifest(
            folder, name=plan.name, config=plan.config, opset=plan.opset, weights=loaded.weights,
            artifacts={file: report.record(**artifact_facts(folder / file),
                                           export_seconds=round(built.seconds[file], 3),
                                           batch_max=PTE_MAX_BATCH if report.spec.runtime == EXECUTORCH_RUNTIME
                                           else None)
                       for file, report in validated.reports.items() if not is_copy(file)},
            optimized=optimized_records(built.copies, validated.reports),
            sweep={"shapes": [list(s) for s in sweep_shapes(plan.config)], "seeds": list(SWEEP_SEEDS)},
        )
        return Sealed(manifest, plan.notes)


def export_preset(name: str, out_root: Path, *, config: MHAConfig | None = None, weights: Path | None = None,
                  layer: int | None = None, opset: int = DEFAULT_OPSET, progress: bool = False,
                  variants: Selection = ALL, announce: Callable[[], None] | None = None) -> ExportResult:
    """Export preset `name` (or `config` under that folder name) into `out_root/name`, with the seed's weights
    or one layer of `weights`, through the one pipeline (run.py: refusals first, staged, placed when valid)."""
    kind = AttentionExport(name, config, weights, layer, opset, variants)
    return run_export(name, out_root, kind, progress=progress, announce=announce)
