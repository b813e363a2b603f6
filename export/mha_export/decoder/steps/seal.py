"""The decoder export's last step: the staged folder's manifest (every file hashed) and the export's notes."""
from __future__ import annotations

import datetime as dt
import json
from importlib.metadata import version
from pathlib import Path

from mha_export.decoder.checkpoint import Origin
from mha_export.decoder.steps.validate import Validated
from mha_export.decoder.tokenizer import TokenizerFiles
from mha_export.pipeline.run import Sealed
from mha_export.pipeline.seal import file_table, versions
from mha_runtime.decoder.chat.folder import listed_template
from mha_runtime.decoder.chat.template import named_tokens
from mha_runtime.decoder.chat.turns import end_of_turn_ids
from mha_runtime.decoder.contract import TOKENIZER_CONFIG, TOKENIZER_FILE, contract_dict
from mha_runtime.decoder.manifest import GPTManifest
from mha_runtime.gguf.llama_cpp import SOURCE


def seal(validated: Validated, folder: Path) -> Sealed:
    """The manifest of the validated `folder`: config, contract, versions (ExecuTorch's and llama.cpp's where the
    folder has their files), weights, tokenizer, eos ids, the end-of-turn ids of a folder with a chat template,
    every file's entry and hash."""
    built = validated.built
    plan, eager = built.plan, built.eager
    config, tokenizer, origin = plan.config, plan.tokenizer, plan.origin
    manifest = GPTManifest(
        name=plan.name, created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), config=config,
        contract=contract_dict(config, executorch=eager.pte is not None, end_of_turn=chat_ends(tokenizer, origin)),
        versions=versions() | ({} if eager.pte is None else {"executorch": version("executorch")})
        | ({} if built.gguf is None else {"gguf": version("gguf"), "llama.cpp": SOURCE}),
        weights=eager.record | {"parameters": config.parameters(tied=eager.tied)},
        tokenizer=None if tokenizer is None else {"file": TOKENIZER_FILE, "vocab_size": tokenizer.vocab_size,
                                                  "built_from": tokenizer.source},
        eos_id=origin.eos_id, eos_ids=list(origin.eos_ids), artifacts=dict(validated.artifacts),
        files=file_table(folder))
    return Sealed(manifest, built.notes)


def chat_ends(tokenizer: TokenizerFiles | None, origin: Origin) -> tuple[int, ...] | None:
    """The end-of-turn ids of a folder whose tokenizer_config.json has a chat template (mha_runtime.decoder.chat.turns),
    None for one without (its manifest stays as it was before the field)."""
    if tokenizer is None:
        return None
    config = json.loads(tokenizer.config_json)
    template = listed_template(config, TOKENIZER_CONFIG)
    if template is None:
        return None
    return end_of_turn_ids(template, named_tokens(config), tokenizer.tokenizer_json, origin.eos_ids)
