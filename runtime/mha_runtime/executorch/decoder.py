"""gpt.pte (ExecuTorch) from the torch-free runtime: its bounds, checked here, and its runner, found by entry point.

Running a .pte needs ExecuTorch (and torch), so the runner lives in the export package and is registered under
the `mha.runners` entry-point group as `gpt-executorch`; this module only finds it, or says what to install.
The bounds (batch, context_length, max_prefill_tokens) are the manifest's and are checked before the program is
loaded: ExecuTorch plans the cache at a fixed [batch, H, context_length, D], and a call beyond it would fail in
the runtime or write outside the planned buffer.
"""
from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from importlib.util import find_spec
from typing import Any, Protocol

from mha_runtime.artifact.errors import ArtifactError, ContractError
from mha_runtime.decoder.contract import PTE_FORM, pte_bounds
from mha_runtime.decoder.shapes import DecoderShapes

RUNNERS_GROUP = "mha.runners"
GPT_PTE_RUNNER = "gpt-executorch"
INSTALL = "pip install './export[executorch]' (the mha-export package with ExecuTorch)"


class RunnerMissing(ArtifactError):
    """This environment cannot run gpt.pte (the export package or ExecuTorch is not installed)."""


class PteProgram(Protocol):
    def load(self) -> Any: ...  # ExecuTorch loads the program (once)

    def decoder(self) -> Any: ...  # a mha_runtime.decoder.decoder.Decoder over the program's own cache


def check_bounds(bounds: dict[str, Any], shapes: DecoderShapes, where: str) -> dict[str, int]:
    """The manifest's bounds must be the ones this contract gives its shapes (a hand-edited manifest is refused)."""
    expected = pte_bounds(shapes)
    if bounds != expected:
        raise ArtifactError(f"{where}: bounds {bounds} in the manifest, expected {expected} for its contract.shapes")
    return expected


def check_request(prompts: list[list[int]], max_new_tokens: int, bounds: dict[str, int]) -> None:
    """One line for a request gpt.pte cannot take: more rows than its batch, or prompt + new tokens beyond its
    context (the ONNX forms stop at context_length; this program is refused up front instead)."""
    if len(prompts) > bounds["batch"]:
        raise ContractError(f"{PTE_FORM}: batch {len(prompts)}, the program's bound is batch <= {bounds['batch']} "
                            "(its cache is planned for one sequence); use gpt.inplace.onnx for a batch")
    for prompt in prompts:
        if len(prompt) + max_new_tokens > bounds["context_length"]:
            raise ContractError(f"{PTE_FORM}: prompt {len(prompt)} + max_new_tokens {max_new_tokens} = "
                                f"{len(prompt) + max_new_tokens} tokens, beyond its context_length "
                                f"{bounds['context_length']}")


def pte_program(data: bytes, config: dict[str, Any], shapes: DecoderShapes, bounds: dict[str, int], *, where: str,
                threads: int | None = None) -> PteProgram:
    """The registered runner over already verified bytes, or RunnerMissing naming what to install. It is called as
    factory(data, config, shapes, bounds, where=, threads=): `config` the manifest's (the architecture's own dict,
    which the program's embedded config must equal), `shapes` its contract.shapes."""
    found = [ep for ep in entry_points(group=RUNNERS_GROUP) if ep.name == GPT_PTE_RUNNER]
    if not found:
        raise RunnerMissing(f"{where}: running gpt.pte needs ExecuTorch: {INSTALL}")
    try:
        factory: Callable[..., PteProgram] = found[0].load()
        if find_spec("executorch") is None:  # the runner is registered, but the extra may not be installed
            raise ModuleNotFoundError(name="executorch")
    except ImportError as exc:
        raise RunnerMissing(f"{where}: running gpt.pte needs ExecuTorch: {INSTALL} (missing module "
                            f"{exc.name!r})") from None
    return factory(data, config, shapes, bounds, where=where, threads=threads)
