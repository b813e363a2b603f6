"""config.json, generation_config.json and onnx/model.onnx: the folder as a Hugging Face GPT-2 ONNX model, which
Optimum's `ORTModelForCausalLM.from_pretrained(folder)` and transformers.js' `AutoModelForCausalLM.from_pretrained`
load as it is (docs/gpt.md, "Hugging Face's clients").

`gpt.onnx` already speaks their names (mha_runtime.decoder.contract); what they still read is the model's config:

- `config.json`: a `GPT2LMHeadModel` equivalent to the model, written by hand from transformers' documented
  GPT2Config fields (transformers is no dependency of the export; tests/decoder/test_gpt_dropin.py reads it back with
  `GPT2Config.from_pretrained`). The book's GPTModel is GPT-2's architecture (tanh GELU, LayerNorm eps 1e-5,
  learned positions, pre-norm blocks); its two differences are carried by the weights: without `qkv_bias` its
  q/k/v biases are zero, and its own output head is `tie_word_embeddings: false`. The clients read the shapes
  (n_layer, n_head, n_embd) to make the empty cache, and `model_type` to pick GPT-2's code path;
  `transformers.js_config.dtype` fp32 keeps a browser (whose default is q8, `onnx/model_quantized.onnx`) on
  `onnx/model.onnx`.
  A Hugging Face checkpoint's own dropouts, initializer_range, bos, eos and pad (mha_export.decoder.checkpoint.CARRIED)
  are written as it said them, and left out where it said nothing (transformers' defaults then apply, as to it).
- `generation_config.json`: the checkpoint's own, as it said it; without one, GPT-2's eos (<|endoftext|>, 50256)
  as bos and eos when the vocabulary has it.
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

from mha_export.decoder.checkpoint import CARRIED, Origin
from mha_runtime.decoder.config import LAYER_NORM_EPS, GPTConfig
from mha_runtime.decoder.contract import CONCAT_FORM, GENERATION_CONFIG, HF_CONFIG, ONNX_MODEL

# The link's target, relative to the link's folder (onnx/).
LINK_TARGET = Path("..") / CONCAT_FORM


def hf_config(cfg: GPTConfig, *, origin: Origin, tied: bool) -> dict[str, Any]:
    """transformers' GPT2Config fields of the model (GPT2Config().to_dict()'s keys that describe it); a checkpoint's
    own fields (origin.generation set) as it said them."""
    eos_id = origin.eos_id
    fields = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": cfg.vocab_size, "n_positions": cfg.context_length, "n_ctx": cfg.context_length,
        "n_embd": cfg.emb_dim, "n_head": cfg.n_heads, "n_layer": cfg.n_layers, "n_inner": 4 * cfg.emb_dim,
        "activation_function": "gelu_new", "layer_norm_epsilon": LAYER_NORM_EPS,
        "resid_pdrop": cfg.drop_rate, "embd_pdrop": cfg.drop_rate, "attn_pdrop": cfg.drop_rate,
        "initializer_range": 0.02, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "tie_word_embeddings": tied, "use_cache": True,
        "bos_token_id": eos_id, "eos_token_id": eos_id,
        "transformers.js_config": {"dtype": "fp32"},
    }
    if origin.generation is None:  # no checkpoint: as every folder before (the presets' bytes are pinned)
        return fields
    return {k: v for k, v in fields.items() if k not in CARRIED} | origin.carried


def generation_config(origin: Origin) -> dict[str, Any]:
    """The checkpoint's GenerationConfig fields as it said them; without a checkpoint, GPT-2's own
    generation_config.json's: bos and eos (generation stops there), none when the vocabulary lacks GPT-2's eos."""
    if origin.generation is not None:
        return origin.generation
    return {} if origin.eos_id is None else {"bos_token_id": origin.eos_id, "eos_token_id": origin.eos_id}


def write_hf_files(stage: Path, cfg: GPTConfig, *, origin: Origin, tied: bool) -> str | None:
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
