"""genai_config.json: the folder as an ONNX Runtime GenAI model (the architecture's GENAI_TYPE, GPT-2's "decoder",
over gpt.onnx).

Decisions from running onnxruntime-genai 0.18 here (docs/gpt.md): eos_token_id is always
written (unset, GenAI takes 0 and stops silently at the first token 0); past_present_share_buffer is false
(gpt.onnx grows its cache by Concat); type "decoder" with Optimum's per-layer names, not "gpt2" (a combined
past_%d cache).
"""
from __future__ import annotations

import json
from typing import Any

from mha_export.decoder.archs import arch_of
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_runtime.decoder.contract import CONCAT_FORM


def genai_config(cfg: DecoderConfig, eos_ids: tuple[int, ...], bos_id: int | None) -> dict[str, Any]:
    """GenAI's decoder config of gpt.onnx: one eos id as a number (GPT-2's folders, byte for byte as before), several
    as the list GenAI also reads (it stops at any of them); pad is the first eos id, bos the model's or that."""
    decoder = {"filename": CONCAT_FORM, "head_size": cfg.head_dim, "hidden_size": cfg.emb_dim,
               "num_attention_heads": cfg.n_heads, "num_hidden_layers": cfg.n_layers,
               "num_key_value_heads": cfg.kv_heads,
               "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                          "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                          "past_value_names": "past_key_values.%d.value"},
               "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                           "present_value_names": "present.%d.value"}}
    return {"model": {"type": arch_of(cfg).GENAI_TYPE, "context_length": cfg.context_length,
                      "vocab_size": cfg.vocab_size,
                      "bos_token_id": eos_ids[0] if bos_id is None else bos_id,
                      "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else list(eos_ids), "pad_token_id": eos_ids[0],
                      "decoder": decoder},
            "search": {"do_sample": False, "max_length": cfg.context_length, "min_length": 0, "num_beams": 1,
                       "num_return_sequences": 1, "past_present_share_buffer": False, "temperature": 1.0,
                       "top_k": 1, "top_p": 1.0, "repetition_penalty": 1.0, "length_penalty": 1.0,
                       "early_stopping": True, "no_repeat_ngram_size": 0, "diversity_penalty": 0.0}}


def genai_json(cfg: DecoderConfig, eos_ids: tuple[int, ...], bos_id: int | None) -> bytes:
    return (json.dumps(genai_config(cfg, eos_ids, bos_id), indent=2, sort_keys=True) + "\n").encode()
