"""The decoder export's last step: the staged folder's manifest (every file hashed) and the export's notes."""
from __future__ import annotations

import datetime as dt
from importlib.metadata import version
from pathlib import Path

from mha_export.decoder.steps.validate import Validated
from mha_export.pipeline.run import Sealed
from mha_export.pipeline.seal import file_table, versions
from mha_runtime.decoder.contract import TOKENIZER_FILE, contract_dict
from mha_runtime.decoder.manifest import GPTManifest
from mha_runtime.gguf.llama_cpp import SOURCE


def seal(validated: Validated, folder: Path) -> Sealed:
    """The manifest of the validated `folder`: config, contract, versions (ExecuTorch's and llama.cpp's where the
    folder has their files), weights, tokenizer, eos ids, every file's entry and hash."""
    built = validated.built
    plan, eager = built.plan, built.eager
    config, tokenizer, origin = plan.config, plan.tokenizer, plan.origin
    manifest = GPTManifest(
        name=plan.name, created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), config=config,
        contract=contract_dict(config, executorch=eager.pte is not None),
        versions=versions() | ({} if eager.pte is None else {"executorch": version("executorch")})
        | ({} if built.gguf is None else {"gguf": version("gguf"), "llama.cpp": SOURCE}),
        weights=eager.record | {"parameters": config.parameters(tied=eager.tied)},
        tokenizer=None if tokenizer is None else {"file": TOKENIZER_FILE, "vocab_size": tokenizer.vocab_size,
                                                  "built_from": tokenizer.source},
        eos_id=origin.eos_id, eos_ids=list(origin.eos_ids), artifacts=dict(validated.artifacts),
        files=file_table(folder))
    return Sealed(manifest, built.notes)
