"""A decoder folder's manifest.json (kind "decoder"; "gpt" in folders exported before it was named so): config,
contract, shapes, weights, tokenizer, artifacts, files (torch-free).

Every file is listed with its size and sha256 and is checked before it is parsed, as in the attention folders.
The manifest's `config` is the architecture's own dict: carried, shown and compared with each model's metadata,
never read for a shape; every shape a runtime allocates is `contract.shapes` (GPTManifest.shapes).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mha_runtime.artifact.errors import ArtifactError, first_line
from mha_runtime.artifact.fields import Record, get, keyed, obj, plain_name, record
from mha_runtime.artifact.manifest import DECODER_KIND, FileRecord, kind_named, read_manifest_json, read_verified
from mha_runtime.decoder.shapes import DecoderShapes, read_shapes

GPT_MANIFEST_FORMAT = 1
# Most eos ids a folder holds: the C runner's fixed array (runtime/native/c/gpt.h, GPT_MAX_EOS).
MAX_EOS_IDS = 64
# A lossy form's quality figures and quantization plan as `mha inspect` shows them: numbers, and objects of names.
_QUALITY_NUMBERS = ("mean_kl", "p99_kl", "same_top")
_PLAN_OBJECTS = ("kept", "finer")


@dataclass(frozen=True)
class GPTArtifact(Record):
    """How one decoder file was judged against eager PyTorch."""

    OMIT_NONE: ClassVar[bool] = True  # the fp32 forms' entries stay as they were

    kind: str  # concat | inplace
    dtype: str  # fp32 | int8 | int4
    tolerance: dict[str, Any]
    cases: int
    max_abs_error: float
    greedy_agreement: float  # share of greedy tokens equal to eager PyTorch's over the golden prompts
    passed: bool
    export_seconds: float
    bounds: dict[str, Any] | None = None  # gpt.pte only: batch, context_length, max_prefill_tokens
    # A lossy form only: mha_runtime.decoder.quality.Quality's fields and the bar; the quantization plan; the file of
    # its own golden generations.
    quality: dict[str, Any] | None = None
    quantization: dict[str, Any] | None = None
    generations: str | None = None

    @classmethod
    def from_dict(cls, data: Any, where: str) -> GPTArtifact:
        read = record(cls, data, where, generations=lambda g: plain_name(g, f"{where}: generations"))
        # The figures `mha inspect` formats, typed here (manifest.json is not listed in itself: an edited string in
        # them was an internal error after half the output).
        for key in (k for k in _QUALITY_NUMBERS if k in (read.quality or {})):
            get(read.quality or {}, key, float, f"{where}: quality")  # null too: it is formatted as a number
        for key in _PLAN_OBJECTS:
            get(read.quantization or {}, key, dict, f"{where}: quantization", optional=True)
        return read


@dataclass(frozen=True)
class GPTManifest(Record):
    name: str
    created: str
    config: dict[str, Any]  # the architecture's own config (GPT-2: the book's keys), carried and compared
    contract: dict[str, Any]  # its "shapes" are `shapes`
    versions: dict[str, str]
    weights: dict[str, Any]  # source, sha256, layout, tied
    tokenizer: dict[str, Any] | None  # file, vocab_size, source; None: the folder works on token ids
    eos_id: int | None  # the first of eos_ids: what folders made before eos_ids hold alone
    artifacts: dict[str, GPTArtifact]
    files: dict[str, FileRecord]
    # Every id generation stops at (Hugging Face allows several); None in a folder made before it (then eos_id).
    eos_ids: list[int] | None = None
    # contract.shapes, checked (a folder made before it: derived from its config, read_shapes); not written again.
    shapes: DecoderShapes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.config, dict):  # a writer may hand the architecture's config object: its dict
            object.__setattr__(self, "config", self.config.to_dict())
        object.__setattr__(self, "shapes", read_shapes(self.contract, self.config, "manifest"))

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The ids a generation stops at, for old and new folders alike: the one definition every runtime uses
        (runtime/native/common/gpt/folder.mjs and runtime/native/c/gpt_manifest.c read the same two fields)."""
        if self.eos_ids is not None:
            return tuple(self.eos_ids)
        return () if self.eos_id is None else (self.eos_id,)

    def to_dict(self) -> dict[str, Any]:
        written = {k: v for k, v in super().to_dict().items() if k != "shapes"}  # shapes: inside the contract
        return {"format": GPT_MANIFEST_FORMAT, "kind": DECODER_KIND} | written

    @classmethod
    def from_dict(cls, data: Any, where: str) -> GPTManifest:
        data = obj(data, where)
        if kind_named(data.get("kind")) != DECODER_KIND or data.get("format") != GPT_MANIFEST_FORMAT or isinstance(
                data.get("format"), bool):  # true == 1
            raise ArtifactError(f"{where}: expected a decoder manifest (kind {DECODER_KIND!r}, format "
                                f"{GPT_MANIFEST_FORMAT}), got kind {data.get('kind')!r}, format "
                                f"{data.get('format')!r} (export GPT folders with `mha export --gpt`)")
        config, contract = get(data, "config", dict, where), get(data, "contract", dict, where)
        vocab_size = read_shapes(contract, config, where).vocab_size
        tokenizer = data.get("tokenizer")
        if tokenizer is not None and not isinstance(tokenizer, dict):
            raise ArtifactError(f"{where}: 'tokenizer' must be an object or null")
        eos = data.get("eos_id")
        if eos is not None and not _token_id(eos, vocab_size):
            raise ArtifactError(f"{where}: 'eos_id' must be a token id below vocab_size or null, got {eos!r}")
        eos_ids = data.get("eos_ids")
        if eos_ids is not None and (not isinstance(eos_ids, list) or len(eos_ids) > MAX_EOS_IDS
                                    or not all(_token_id(i, vocab_size) for i in eos_ids)):
            raise ArtifactError(f"{where}: 'eos_ids' must be a list of at most {MAX_EOS_IDS} token ids below "
                                f"vocab_size, got {first_line(json.dumps(eos_ids))[:60]}")
        if eos_ids is not None and eos != (eos_ids[0] if eos_ids else None):
            raise ArtifactError(f"{where}: 'eos_id' {eos!r} is not the first of 'eos_ids' {eos_ids[:4]!r}")
        return cls(name=get(data, "name", str, where), created=get(data, "created", str, where), config=config,
                   contract=contract, versions=get(data, "versions", dict, where),
                   weights=get(data, "weights", dict, where), tokenizer=tokenizer, eos_id=eos,
                   artifacts=keyed(get(data, "artifacts", dict, where), f"{where}: artifacts", GPTArtifact.from_dict),
                   files=keyed(get(data, "files", dict, where), f"{where}: files", FileRecord.from_dict),
                   eos_ids=eos_ids)


def _token_id(value: object, vocab_size: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size


def load_gpt_manifest(folder: Path) -> GPTManifest:
    """Read folder/manifest.json as a decoder manifest, or raise ArtifactError naming what is wrong."""
    path, data = read_manifest_json(folder, label="GPT folder", made_by="`mha export --gpt`")
    return GPTManifest.from_dict(data, str(path))


def read_listed_json(folder: Path, manifest: GPTManifest, file: str, *, kind: str, fmt: int,
                     what: str) -> tuple[str, dict[str, Any]]:
    """A listed JSON file of kind `kind` and format `fmt` after its size and sha256 check, with its name for error
    lines; ArtifactError if the manifest lists none (`what`) or it is broken."""
    where = str(Path(folder) / file)
    if file not in manifest.files:
        raise ArtifactError(f"{where}: the manifest lists no {what} (re-export with this version)")
    try:
        doc = obj(json.loads(read_verified(folder, file, manifest)), where)
    except (ValueError, RecursionError) as exc:
        raise ArtifactError(f"{where}: expected JSON ({first_line(exc)})") from None
    if doc.get("kind") != kind or doc.get("format") != fmt or isinstance(doc.get("format"), bool):  # true == 1
        raise ArtifactError(f"{where}: expected kind {kind!r} format {fmt}")
    return where, doc
