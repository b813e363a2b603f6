"""The attention folder's manifest.json as typed records (torch-free): config, contract, how each artifact was
judged, where the weights came from, its offline-optimized copies and its files."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.artifact.fields import Record, get, keyed, obj, record
from mha_runtime.artifact.manifest import DECODER_KIND, FileRecord, kind_named, read_manifest_json
from mha_runtime.artifact.tolerance import Tolerance
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.optimized_records import OptimizedSet, optimized_from_dict

# 2: `preset` became `name` (a folder may hold a custom config), weights gained layout/layer.
MANIFEST_FORMAT = 2


@dataclass(frozen=True)
class ArtifactRecord(Record):
    """How one artifact was judged: its tolerance row and the worst errors over the sweep."""

    kind: str
    runtime: str
    tolerance: Tolerance
    cases: int
    max_abs_error: float
    rel_l2_error: float
    passed: bool
    opset: int | None = None
    nodes: int | None = None
    export_seconds: float | None = None
    batch_max: int | None = None  # a planned maximum (ExecuTorch); None: any batch

    @classmethod
    def from_dict(cls, data: Any, where: str) -> ArtifactRecord:
        return record(cls, data, where, tolerance=lambda t: Tolerance.from_dict(t, f"{where}.tolerance"))


@dataclass(frozen=True)
class WeightsRecord(Record):
    """Where the weights came from: the seed, or a file (its layout, layer and sha256)."""

    OMIT_NONE: ClassVar[bool] = True

    source: str
    sha256: str | None = None
    layout: str | None = None
    layer: int | None = None


@dataclass(frozen=True, kw_only=True)
class Manifest(Record):
    """Everything `mha export` wrote about one artifact folder (its fields in the order manifest.json has them)."""

    name: str
    created: str
    config: MHAConfig
    contract: dict[str, Any]
    opset: int
    versions: dict[str, str]
    weights: WeightsRecord
    validation: dict[str, Any]
    artifacts: dict[str, ArtifactRecord]
    optimized: dict[str, OptimizedSet] = field(default_factory=dict)  # per provider (artifact/optimized_records.py)
    files: dict[str, FileRecord]

    def to_dict(self) -> dict[str, Any]:
        return {"format": MANIFEST_FORMAT} | super().to_dict()

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Manifest:
        data = obj(data, where)
        if kind_named(data.get("kind")) == DECODER_KIND:  # mha_runtime.decoder.manifest reads these
            raise ArtifactError(f"{where}: a decoder folder (made by `mha export --gpt`), not an attention artifact: "
                                "run it with `mha generate DIR`")
        if data.get("format") != MANIFEST_FORMAT:
            raise ArtifactError(f"{where}: expected manifest format {MANIFEST_FORMAT}, got {data.get('format')!r} "
                                "(re-export the folder with this version's `mha export`)")
        config = MHAConfig.from_document(data, where)
        files = get(data, "files", dict, where)
        artifacts = get(data, "artifacts", dict, where)
        return cls(name=get(data, "name", str, where), created=get(data, "created", str, where), config=config,
                   contract=get(data, "contract", dict, where), opset=get(data, "opset", int, where),
                   versions=get(data, "versions", dict, where),
                   weights=WeightsRecord.from_dict(get(data, "weights", dict, where), f"{where}: weights"),
                   validation=get(data, "validation", dict, where),
                   artifacts=keyed(artifacts, f"{where}: artifacts", ArtifactRecord.from_dict),
                   files=keyed(files, f"{where}: files", FileRecord.from_dict),
                   optimized=optimized_from_dict(data.get("optimized"), f"{where}: optimized"))


def load_manifest(artifact_dir: Path) -> Manifest:
    """Read `artifact_dir/manifest.json`, or raise ArtifactError naming what is wrong."""
    path, data = read_manifest_json(artifact_dir, label="artifact folder", made_by="`mha export`")
    return Manifest.from_dict(data, str(path))
