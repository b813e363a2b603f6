"""The decoder export's second step: the weights read into the eager model, and what eager PyTorch makes for every
file to be judged against (the references, the golden generations, gpt.pte judged by ExecuTorch's runtime); the
eager model itself is not kept."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from mha_export.decoder import eager
from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.golden import golden_generations
from mha_export.decoder.steps.plan import Plan
from mha_export.decoder.validate import References, references
from mha_export.decoder.weights import read_gpt_weights
from mha_runtime.artifact.errors import ConfigError
from mha_runtime.artifact.manifest import sha256_file
from mha_runtime.decoder.golden import GoldenGeneration

if TYPE_CHECKING:
    from mha_export.executorch.decoder import PteResult

# The golden generations: the cases and their first-step logits by case name (mha_export.decoder.golden).
Golden = tuple[list[GoldenGeneration], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Eager:
    """What eager PyTorch made, kept to the seal: the weights' record, the references every form is judged
    against (None: the GGUF files alone, judged by llama.cpp), the golden generations, gpt.pte where asked for."""

    record: dict[str, object]
    tied: bool
    encode: Callable[[str], list[int]] | None  # the folder's tokenizer, where it has one
    refs: References | None
    golden: Golden
    pte: PteResult | None


@dataclass(frozen=True)
class Loaded:
    """The plan, what eager PyTorch made, and the weights (book keys, no buffers): held by this value alone,
    so they go when the build step returns it."""

    plan: Plan
    eager: Eager
    state: dict[str, torch.Tensor]


def load_gpt(cfg: DecoderConfig, weights: Path | None
             ) -> tuple[eager.Eager, dict[str, torch.Tensor], dict[str, object]]:
    """The eager model, its state (book keys, without the architecture's buffers) and the manifest's weights
    record."""
    arch = arch_of(cfg)
    model = eager.seeded_gpt(cfg)
    if weights is None:
        record: dict[str, object] = {"source": f"torch.manual_seed({eager.SEED})", "layout": arch.BOOK_LAYOUT,
                                     "tied": False}
    else:
        loaded = read_gpt_weights(weights, cfg)
        model.load_state_dict(loaded.state, strict=False)  # the buffers (GPT-2's masks) stay the config's
        record = {"source": Path(weights).name, "sha256": sha256_file(Path(weights)), "layout": loaded.layout,
                  "tied": loaded.tied}
    state = {k: v.detach() for k, v in model.state_dict().items() if not arch.BUFFERS.fullmatch(k)}
    return model.eval(), state, record


def load(plan: Plan) -> Loaded:
    """The weights, the references every form is judged against, the golden generations and gpt.pte (from the
    eager model, judged by executorch.runtime)."""
    config, forms = plan.config, plan.forms
    model, state, record = load_gpt(config, plan.weights)
    encode = None if plan.tokenizer is None else _encoder(plan.tokenizer.tokenizer_json)
    refs = references(model, config) if forms.files or forms.pte else None  # gguf alone: none
    golden = golden_generations(model, config, encode)
    _check_finite(refs, golden[1])
    pte = None
    if forms.pte:
        from mha_export.executorch.decoder import build_pte

        pte = build_pte(model, config, refs, golden)
    return Loaded(plan, Eager(record, bool(record["tied"]), encode, refs, golden, pte), state)


def _check_finite(refs: References | None, golden: dict[str, np.ndarray]) -> None:
    """Refuse weights whose eager logits are NaN or inf: finite values that overflow float32 in the forward pass.
    Every form would then fail validation against them, one line per case, after all of the work."""
    arrays = [*golden.values(), *([] if refs is None else [refs.first, *(case.expected for case in refs.cases)])]
    if not all(np.isfinite(a).all() for a in arrays):
        raise ConfigError("weights: eager PyTorch's logits are NaN or inf with these weights (their values overflow "
                          "float32 in the forward pass); no exported form could be checked against them")


def _encoder(tokenizer_json: bytes) -> Callable[[str], list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    # With tokenizer.json's own post-processor, as every runtime encodes a prompt (Gemma's <bos> first).
    return lambda text: list(tok.encode(text).ids)
