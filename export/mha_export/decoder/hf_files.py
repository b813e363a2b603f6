"""config.json, generation_config.json and onnx/model.onnx: the folder as a Hugging Face ONNX model of its
architecture (GPT-2's: GPT2LMHeadModel), which Optimum's `ORTModelForCausalLM.from_pretrained(folder)` and
transformers.js' `AutoModelForCausalLM.from_pretrained` load as it is (docs/gpt.md, "Hugging Face's clients").

`gpt.onnx` already speaks their names (mha_runtime.decoder.contract); what they still read is the model's config:

- `config.json`: the architecture's Hugging Face model equivalent to the model, written by hand from transformers'
  documented config fields (its `hf_config`: GPT-2's GPT2Config; transformers is no dependency of the export;
  tests/decoder/test_gpt_dropin.py reads it back with `GPT2Config.from_pretrained`). The clients read the shapes to
  make the empty cache, and `model_type` to pick the architecture's code path.
  A Hugging Face checkpoint's own fields that the architecture carries (its HF_CARRIED: GPT-2's dropouts,
  initializer_range, bos, eos and pad) are written as it said them, and left out where it said nothing
  (transformers' defaults then apply, as to it).
- `generation_config.json`: the checkpoint's own, as it said it; without one, the folder's eos (GPT-2's
  <|endoftext|>, 50256, when the vocabulary has it) as bos and eos.
- `onnx/model.onnx`: transformers.js loads `<folder>/onnx/model.onnx` (its `subfolder` option defaults to "onnx"
  and its model file name to "model"; config.json cannot move it), and Optimum, given no file_name, takes the one
  .onnx file named `model.onnx` anywhere under the folder (`_infer_file_path`'s standard name). It is a relative
  symbolic link to `../gpt.onnx`, so no weights are duplicated, or a hard link where symbolic links cannot be made;
  the manifest lists it with its size and sha256 like every file: read through the link, it verifies; re-pointed
  or replaced by other bytes, it is refused.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.decoder.checkpoint import Origin
from mha_runtime.decoder.contract import CONCAT_FORM, GENERATION_CONFIG, HF_CONFIG, ONNX_MODEL

# The link's target, relative to the link's folder (onnx/).
LINK_TARGET = Path("..") / CONCAT_FORM


def hf_config(cfg: DecoderConfig, *, origin: Origin, tied: bool) -> dict[str, Any]:
    """The architecture's Hugging Face config fields of the model; a checkpoint's own fields (origin.generation set)
    as it said them."""
    arch = arch_of(cfg)
    fields = arch.hf_config(cfg, tied=tied, eos_id=origin.eos_id)
    if origin.generation is None:  # no checkpoint: as every folder before (the presets' bytes are pinned)
        return fields
    return {k: v for k, v in fields.items() if k not in arch.HF_CARRIED} | origin.carried


def generation_config(origin: Origin) -> dict[str, Any]:
    """The checkpoint's GenerationConfig fields as it said them; without a checkpoint, the folder's eos as bos and
    eos (GPT-2's own generation_config.json's; generation stops there), none when it has no eos."""
    if origin.generation is not None:
        return origin.generation
    return {} if origin.eos_id is None else {"bos_token_id": origin.eos_id, "eos_token_id": origin.eos_id}


def write_hf_files(stage: Path, cfg: DecoderConfig, *, origin: Origin, tied: bool) -> str | None:
    """Write config.json, generation_config.json and link onnx/model.onnx to gpt.onnx (already in `stage`).
    Returns a note when the link cannot be made (the folder then needs the clients' file options)."""
    (stage / HF_CONFIG).write_bytes(_json(hf_config(cfg, origin=origin, tied=tied)))
    (stage / GENERATION_CONFIG).write_bytes(_json(generation_config(origin)))
    link = stage / ONNX_MODEL
    link.parent.mkdir(exist_ok=True)
    try:
        link.symlink_to(LINK_TARGET)
    except OSError:
        try:
            os.link(stage / CONCAT_FORM, link)
        except OSError as exc:
            link.parent.rmdir()
            return (f"{ONNX_MODEL}: this filesystem makes neither a symbolic nor a hard link ({exc.strerror}); "
                    f"load {CONCAT_FORM} with Optimum's file_name=\"{CONCAT_FORM}\", transformers.js' "
                    "{subfolder: '', model_file_name: 'gpt'}")
    return None


def _json(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()
