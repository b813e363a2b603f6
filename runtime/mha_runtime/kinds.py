"""The table of model kinds (torch-free): per kind, what makes its folders, how `mha check` judges its golden cases,
how `mha inspect` shows it, what `mha run`, `mha generate` and `mha triton` run it with (where the kind has them),
the HTTP route it is served on, how `mha serve` prepares it and its model in a replica of the one Ray deployment
(serve/deployment.py). A folder's kind is read from its manifest (artifact.manifest.folder_kind); the commands look
the kind up here instead of asking "is it a GPT?", and a command a kind has no target for is one line naming what
the kind offers. The export package's commands (export, validate, bench) look the kind up in mha_export.kinds.

Each target is named by a loader: a small function that imports it when called and returns it, as an entry
point's load() does. Looking a kind up loads nothing (inspect needs no ONNX Runtime, serve no Ray until a replica),
while mypy, editors and tests/commands/test_kinds.py follow every name."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.artifact.manifest import ATTENTION_KIND, DECODER_KIND, folder_kind, read_manifest_json

if TYPE_CHECKING:
    from mha_runtime.artifact.results import CaseResult
    from mha_runtime.attention.runner import OnnxRunner
    from mha_runtime.decoder.generate import Generator
    from mha_runtime.serve.options import ServeOptions
    from mha_runtime.serve.replica import KindReplica
    from mha_runtime.triton import TritonModel

T = TypeVar("T")


class Checker(Protocol):
    def __call__(self, folder: Path, *, provider: str, threads: int | None) -> list[CaseResult]: ...


class Inspector(Protocol):
    def __call__(self, folder: Path, *, as_json: bool) -> None: ...


class TritonWriter(Protocol):
    def __call__(self, artifact: Path, *, name: str | None = ..., model: str = ...,
                 max_batch: int = ...) -> list[TritonModel]: ...


# (ServeOptions) -> (files for the replicas, /v1/contract's answer)
Preparer = Callable[["ServeOptions"], tuple[dict[str, bytes], dict[str, Any]]]
# (files, options, info) -> the kind's model in a replica
Replicator = Callable[[dict[str, bytes], "ServeOptions", dict[str, Any]], "KindReplica"]
# The commands a row may offer, in the order a refusal names them.
COMMANDS = ("run", "generate", "check", "inspect", "serve", "triton", "validate", "bench")


@dataclass(frozen=True)
class ModelKind:
    name: str
    made_by: str  # the command that exports such a folder
    route: str  # where `mha serve` answers
    requests_per_slot: int  # requests a replica may hold per batch slot (those past the slots wait in it)
    local_ingress: str  # `mha serve`'s default ingress on a local Ray instance: "proxy" or "haproxy"
    batch_wait: bool  # whether --batch-wait-ms applies (requests batched by Ray Serve, not slots stepped together)
    checker: Callable[[], Checker]
    inspector: Callable[[], Inspector]
    preparer: Callable[[], Preparer]
    replicator: Callable[[], Replicator]  # imports the kind's serving modules (Ray): only inside a replica
    runner: Callable[[], type[OnnxRunner]] | None = None  # `mha run`: one input through a file
    generator: Callable[[], type[Generator]] | None = None  # `mha generate`
    triton: Callable[[], TritonWriter] | None = None  # `mha triton`: a Triton model repository
    export_commands: tuple[str, ...] = ()  # the export package's commands it offers (mha_export.kinds holds them)

    def loaders(self) -> dict[str, Callable[[], object]]:
        """Every target of the row by what it is for; the absent ones left out."""
        named = {"check": self.checker, "inspect": self.inspector, "serve": self.preparer,
                 "replica": self.replicator, "run": self.runner, "generate": self.generator, "triton": self.triton}
        return {what: loader for what, loader in named.items() if loader is not None}

    def offers(self) -> list[str]:
        """The `mha` commands that take a folder of this kind."""
        own = {*self.loaders(), *self.export_commands}
        return [command for command in COMMANDS if command in own]

    def refusal(self, command: str, folder: Path) -> ArtifactError:
        """The one line for a command this kind has no target for; a folder whose manifest cannot be read (taken for
        an attention folder by folder_kind) is told that instead."""
        read_manifest_json(folder, label="folder", made_by="`mha export`")
        article = "an" if self.name[0] in "aeiou" else "a"
        return ArtifactError(f"{folder}: {article} {self.name} folder (made by {self.made_by}) has no `mha {command}`; "
                             f"it offers {', '.join('mha ' + c for c in self.offers())}")

    def check(self, folder: Path, *, provider: str, threads: int | None) -> list[CaseResult]:
        return self.checker()(folder, provider=provider, threads=threads)

    def inspect(self, folder: Path, *, as_json: bool) -> None:
        self.inspector()(folder, as_json=as_json)

    def prepare_serving(self, options: ServeOptions) -> tuple[dict[str, bytes], dict[str, Any]]:
        return self.preparer()(options)

    def replica(self, files: dict[str, bytes], options: ServeOptions, info: dict[str, Any]) -> KindReplica:
        return self.replicator()(files, options, info)

    def needs(self, loader: Callable[[], T] | None, command: str, folder: Path) -> T:
        """`loader`'s target, or the kind's one line when it has none for `command`."""
        if loader is None:
            raise self.refusal(command, folder)
        return loader()


def _check_attention() -> Checker:
    from mha_runtime.attention.golden_check import check_golden
    return check_golden


def _inspect_attention() -> Inspector:
    from mha_runtime.cli.attention_inspect import inspect_attention
    return inspect_attention


def _prepare_attention() -> Preparer:
    from mha_runtime.serve.attention.prepare import prepare_attention
    return prepare_attention


def _attention_replica() -> Replicator:
    from mha_runtime.serve.attention.replica import ContextReplica
    return ContextReplica


def _attention_runner() -> type[OnnxRunner]:
    from mha_runtime.attention.runner import OnnxRunner
    return OnnxRunner


def _attention_triton() -> TritonWriter:
    from mha_runtime.triton import triton_models
    return triton_models


def _check_decoder() -> Checker:
    from mha_runtime.decoder.golden_check import check_generations
    return check_generations


def _inspect_decoder() -> Inspector:
    from mha_runtime.cli.decoder_inspect import inspect_gpt
    return inspect_gpt


def _prepare_decoder() -> Preparer:
    from mha_runtime.serve.decoder.prepare import prepare_gpt
    return prepare_gpt


def _decoder_replica() -> Replicator:
    from mha_runtime.serve.decoder.replica import GenerateReplica
    return GenerateReplica


def _decoder_generator() -> type[Generator]:
    from mha_runtime.decoder.generate import Generator
    return Generator


KINDS: dict[str, ModelKind] = {
    ATTENTION_KIND: ModelKind(
        ATTENTION_KIND, "`mha export`", "/v1/context", requests_per_slot=2, local_ingress="proxy", batch_wait=True,
        checker=_check_attention, inspector=_inspect_attention, preparer=_prepare_attention,
        replicator=_attention_replica, runner=_attention_runner, triton=_attention_triton,
        export_commands=("validate", "bench")),
    # HAProxy by default on a local instance: the streamed tokens skip the Python proxy
    # (docs/measurements/serving.md, "Which ingress"); slots are stepped together, no batch wait
    DECODER_KIND: ModelKind(
        DECODER_KIND, "`mha export --gpt`", "/v1/generate", requests_per_slot=4, local_ingress="haproxy",
        batch_wait=False, checker=_check_decoder, inspector=_inspect_decoder, preparer=_prepare_decoder,
        replicator=_decoder_replica, generator=_decoder_generator, export_commands=("validate",)),
}


def kind_of(folder: Path) -> ModelKind:
    """The kind of the model in `folder` (an unreadable folder: attention, whose loader names the problem)."""
    return KINDS[folder_kind(folder)]
