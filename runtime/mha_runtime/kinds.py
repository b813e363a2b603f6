"""The table of model kinds (torch-free): per kind, what makes its folders, how `mha check` judges its golden cases,
how `mha inspect` shows it, the HTTP route it is served on, how `mha serve` prepares it and its model in a
replica of the one Ray deployment (serve/deployment.py). A
folder's kind is read from its manifest (artifact.manifest.folder_kind); the commands look the kind up here instead
of asking "is it a GPT?".

The functions are named, not imported, so that looking a kind up loads nothing (inspect needs no ONNX Runtime)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from pkgutil import resolve_name
from typing import Any

from mha_runtime.artifact.manifest import ATTENTION_KIND, DECODER_KIND, folder_kind


@dataclass(frozen=True)
class ModelKind:
    name: str
    made_by: str  # the command that exports such a folder
    route: str  # where `mha serve` answers
    checker: str  # "module:function"(folder, provider=, threads=) -> list[CaseResult]
    inspector: str  # "module:function"(folder, as_json=) -> None
    preparer: str  # "module:function"(ServeOptions) -> (files for the replicas, /v1/contract's answer)
    replicator: str  # "module:class"(files, options, info) -> the kind's model in a replica (a KindReplica)
    requests_per_slot: int  # requests a replica may hold per batch slot (those past the slots wait in it)

    def check(self, folder: Path, *, provider: str, threads: int | None) -> list[Any]:
        return resolve_name(self.checker)(folder, provider=provider, threads=threads)  # type: ignore[no-any-return]

    def inspect(self, folder: Path, *, as_json: bool) -> None:
        resolve_name(self.inspector)(folder, as_json=as_json)

    def prepare_serving(self, options: Any) -> tuple[dict[str, bytes], dict[str, Any]]:
        return resolve_name(self.preparer)(options)  # type: ignore[no-any-return]

    def replica(self, files: dict[str, bytes], options: Any, info: dict[str, Any]) -> Any:
        """Imports the kind's serving modules (Ray for the attention): only inside a replica."""
        return resolve_name(self.replicator)(files, options, info)


KINDS: dict[str, ModelKind] = {
    ATTENTION_KIND: ModelKind(ATTENTION_KIND, "`mha export`", "/v1/context",
                              "mha_runtime.attention.golden_check:check_golden",
                              "mha_runtime.cli.attention_inspect:inspect_attention",
                              "mha_runtime.serve.attention.prepare:prepare_attention",
                              "mha_runtime.serve.attention.replica:ContextReplica", 2),
    DECODER_KIND: ModelKind(DECODER_KIND, "`mha export --gpt`", "/v1/generate",
                        "mha_runtime.decoder.golden_check:check_generations",
                        "mha_runtime.cli.decoder_inspect:inspect_gpt",
                        "mha_runtime.serve.decoder.prepare:prepare_gpt",
                        "mha_runtime.serve.decoder.replica:GenerateReplica", 4),
}


def kind_of(folder: Path) -> ModelKind:
    """The kind of the model in `folder` (an unreadable folder: attention, whose loader names the problem)."""
    return KINDS[folder_kind(folder)]
