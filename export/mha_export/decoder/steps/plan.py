"""The decoder export's first step: every refusal before any work (variants, budget, forms, the tokenizer, the
checkpoint's origin), and what will be built."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.checkpoint import Origin, origin_for
from mha_export.decoder.plan import GPTPlan, plan_gpt
from mha_export.decoder.tokenizer import TokenizerFiles, read_tokenizer


@dataclass(frozen=True)
class Plan:
    """What the export will build, every input checked: the forms, gpt.pte and the GGUF files to build (`forms`:
    whether a lossy miss is a note or a failure, what the default set left out), the tokenizer's files and the
    checkpoint's generation facts."""

    name: str
    config: DecoderConfig
    weights: Path | None
    forms: GPTPlan
    origin: Origin
    tokenizer: TokenizerFiles | None


def plan(name: str, *, config: DecoderConfig, weights: Path | None, tokenizer: Path | None,
         variants: tuple[str, ...] | None, origin: Origin | None) -> Plan:
    """Refuse what cannot be exported, then the plan. `origin` None: read from beside the weights (the architecture's
    default eos without a checkpoint config); `variants` None or with 'all': the default set."""
    forms = plan_gpt(config, variants)
    facts = origin or origin_for(config, weights, None)
    files = None if tokenizer is None else read_tokenizer(tokenizer, vocab_size=config.vocab_size,
                                                           context_length=config.context_length)
    return Plan(name, config, weights, forms, facts, files)
