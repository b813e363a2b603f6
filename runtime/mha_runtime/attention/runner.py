"""The torch-free runner: one ONNX Runtime session per artifact, the contract checked before every run."""
from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from mha_runtime.artifact.config_fields import check_own_config, file_kind
from mha_runtime.artifact.errors import ArtifactError, ConfigError, ContractError, ProviderError, first_line
from mha_runtime.artifact.manifest import MANIFEST_NAME, read_verified
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.contract import INPUT_NAME, META_CONFIG, OUTPUT_NAME, IOContract, check_input, check_output
from mha_runtime.attention.manifest import Manifest, load_manifest
from mha_runtime.attention.registry import ONNX, cpu_only, spec_for
from mha_runtime.infer.pick_copy import Choice, choose, say_once, session_options
from mha_runtime.infer.providers import resolve_provider, session_providers

DEFAULT_MODEL = ONNX.file


class OnnxRunner:
    """Run one ONNX artifact. Build it from an artifact folder (files checked against the manifest)
    or from a single `.onnx` file (checked against a manifest beside it, if there is one)."""

    def __init__(self, artifact: str | Path, *, model: str = DEFAULT_MODEL, provider: str = "auto",
                 threads: int | None = None, offline_optimized: bool = True) -> None:
        """offline_optimized: load the folder's optimized copy of `model` where this machine can use it
        (mha_runtime.infer.pick_copy); False always loads the plain file."""
        if not isinstance(artifact, (str, Path)) or not str(artifact):
            raise ArtifactError(f"artifact: expected a folder or an .onnx/.ort path, got {artifact!r}")
        if not isinstance(model, str) or not model:
            raise ArtifactError(f"model: expected a file name such as {DEFAULT_MODEL!r}, got {model!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ConfigError(f"threads: expected a positive integer or None, got {threads!r}")
        self.provider = resolve_provider(provider)
        folder, name, manifest = locate_model(Path(artifact), model)
        self.path = folder / name
        self.provider = _provider_for(name, self.provider, asked=provider)
        choice = Choice(name)
        if manifest is not None and offline_optimized:
            choice = choose(folder, name, manifest, self.provider)
            if choice.note is not None:
                say_once(choice.note)
        # The file parsed (the optimized copy, or the plain file); verified before any parser sees it.
        self.loaded = folder / choice.file
        self.preoptimized = choice.preoptimized
        data, self.verified = read_located(folder, choice.file, manifest)
        options = session_options(threads, preoptimized=choice.preoptimized)
        try:
            self.session = ort.InferenceSession(data, sess_options=options, providers=session_providers(self.provider))
        except Exception as exc:  # ORT raises its own Fail/InvalidProtobuf types; reduce them to one line
            raise ArtifactError(f"{self.loaded}: ONNX Runtime cannot load it ({first_line(exc)})") from None
        self.metadata: dict[str, str] = dict(self.session.get_modelmeta().custom_metadata_map)
        self.config = _config_from_metadata(self.metadata, self.path)
        if manifest is not None:
            check_own_config(manifest.config, self.config.to_dict(), str(self.path))
        self.contract = IOContract(self.config)
        self.input_names = [i.name for i in self.session.get_inputs()]
        _check_graph(self.session, self.config, self.path)

    def run(self, x: Any) -> np.ndarray:
        """x: (B, T, d_in) float32 -> context: (B, T, num_heads * d_out) float32, checked finite."""
        if self.input_names != [INPUT_NAME]:
            raise ContractError(f"{self.path.name} takes inputs {self.input_names}, not just {INPUT_NAME!r}: "
                                "run the decode form with mha_runtime.attention.decode_session.DecodeSession")
        x = check_input(x, self.config)
        (out,) = self.execute([OUTPUT_NAME], {INPUT_NAME: x})
        return check_output(out, x)

    def execute(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """session.run, with an ONNX Runtime failure reduced to one line naming the model and the shapes."""
        try:
            return self.session.run(names, feeds)
        except Exception as exc:  # ORT's own error types (Fail, InvalidArgument, RuntimeException)
            shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in feeds.items())
            raise ArtifactError(f"{self.path}: ONNX Runtime failed on {shapes} ({first_line(exc)})") from None

    __call__ = run


def _provider_for(name: str, provider: str, *, asked: str) -> str:
    """The provider this form runs on: a form CUDA cannot run is refused for `cuda` and runs on the CPU for `auto`."""
    try:
        why = cpu_only(spec_for(name).kind) if provider == "cuda" else None
    except KeyError:  # a file the registry does not name (a lone .onnx): nothing is known against CUDA
        why = None
    if why is None:
        return provider
    if asked == "auto":
        return "cpu"
    raise ProviderError(f"{name} runs on the CPU only: {why}; use --provider cpu or auto")


def read_model(path: Path, model: str, suffixes: tuple[str, ...] = (".onnx", ".ort")) -> tuple[bytes, Path, bool]:
    """Read the model bytes once and check their size and sha256 against the manifest where one applies, before
    anything parses them; return them, the path, and whether they were verified (False: a lone file with no
    manifest beside it)."""
    folder, name, manifest = locate_model(path, model, suffixes)
    data, verified = read_located(folder, name, manifest)
    return data, folder / name, verified


def locate_model(path: Path, model: str,
                 suffixes: tuple[str, ...] = (".onnx", ".ort")) -> tuple[Path, str, Manifest | None]:
    """The folder, the name the manifest must list, and that manifest: the folder's, or the one beside a file
    (None: a lone file). Refuses a path that is neither a folder nor an existing file of one of `suffixes`."""
    if path.is_dir():
        return path, model, load_manifest(path)
    kinds = "/".join(suffixes)
    if not path.exists():
        raise ArtifactError(f"{path}: expected an artifact folder or a {kinds} file, found nothing there")
    if path.suffix not in suffixes:
        raise ArtifactError(f"{path}: expected an artifact folder or a {kinds} file, got {path.suffix or 'no suffix'}")
    if (path.parent / MANIFEST_NAME).exists():  # a manifest beside the file must list it
        return path.parent, path.name, load_manifest(path.parent)
    return path.parent, path.name, None


def read_located(folder: Path, name: str, manifest: Manifest | None) -> tuple[bytes, bool]:
    """The bytes of `folder/name`, size and sha256 checked against `manifest` where one applies; and whether they
    were checked."""
    if manifest is not None:
        return read_verified(folder, name, manifest), True
    try:
        mode = (folder / name).stat().st_mode
        if not stat.S_ISREG(mode):  # a FIFO would block the read for ever, /dev/zero fill the memory
            raise ArtifactError(f"{folder / name}: expected a model file, got {file_kind(mode)}")
        return (folder / name).read_bytes(), False
    except OSError as exc:
        raise ArtifactError(f"{folder / name}: cannot read it ({exc.strerror or first_line(exc)})") from None


def _check_graph(session: ort.InferenceSession, config: MHAConfig, path: Path) -> None:
    """The graph's x and context must have the widths the metadata's config promises (a lone file whose
    metadata disagrees with its graph is refused here, not deep inside a run)."""
    widths = {INPUT_NAME: config.d_in, OUTPUT_NAME: config.d_model}
    for value in [*session.get_inputs(), *session.get_outputs()]:
        if value.name in widths:
            last = value.shape[-1] if value.shape else None
            if len(value.shape) != 3 or (isinstance(last, int) and last != widths[value.name]):
                raise ArtifactError(f"{path}: graph {value.name!r} has shape {value.shape}, but its metadata's "
                                    f"config says [batch, tokens, {widths[value.name]}]")


def _config_from_metadata(metadata: dict[str, str], path: Path) -> MHAConfig:
    text = metadata.get(META_CONFIG)
    if text is None:
        raise ArtifactError(f"{path}: expected '{META_CONFIG}' in the model's metadata (export it with `mha export`)")
    try:
        return MHAConfig.from_json(text)
    except ConfigError as exc:
        raise ArtifactError(f"{path}: metadata '{META_CONFIG}' is invalid: {exc}") from None


__all__ = ["DEFAULT_MODEL", "OnnxRunner", "locate_model", "read_model"]
