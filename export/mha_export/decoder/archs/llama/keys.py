"""The Llama family's weight names, torch-free: the book's Llama3Model / Qwen3Model state_dict keys (canonical) with
their shapes, and Hugging Face's LlamaForCausalLM / Qwen3ForCausalLM keys onto them.

The two books differ in one name: Llama3Model's norms are torch.nn.RMSNorm (`weight`), Qwen3Model's are the book's
own RMSNorm (`scale`); Qwen3Model adds `att.q_norm.scale` and `att.k_norm.scale` (head_dim each) where qk_norm.
The feed-forward is SwiGLU: fc1 the gate, fc2 the up projection, fc3 the down projection.
"""
from __future__ import annotations

import re

from mha_export.decoder.archs.llama.config import RotaryConfig

HEAD = "out_head.weight"
# Buffers, not parameters: older transformers saved each layer's rotary inv_freq; the book's standalone notebooks
# registered their masks and RoPE tables persistently. Ignored wherever they appear.
BUFFERS = re.compile(r"(model\.)?(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq"
                     r"|(trf_blocks\.\d+\.att\.)?(mask|cos|sin)")
# Hugging Face's token embedding: the signature of its checkpoint (LlamaForCausalLM: 'model.' before it; the bare
# LlamaModel / Qwen3Model: none).
HF_SIGNATURE = re.compile(r"(model\.)?embed_tokens\.weight")
HF_HEAD = "lm_head.weight"  # never under the prefix


def norm_param(cfg: RotaryConfig) -> str:
    """The norms' parameter name: torch.nn.RMSNorm's `weight` (Llama3Model), the book's RMSNorm's `scale`
    (Qwen3Model)."""
    return "scale" if cfg.arch == "qwen3" else "weight"


def book_shapes(cfg: RotaryConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of the book's model for `cfg`, with its shape (Linear weights (out, in))."""
    e, v, d, f = cfg.emb_dim, cfg.vocab_size, cfg.head_dim, cfg.hidden_dim
    q, kv, n = cfg.n_heads * d, cfg.kv_heads * d, norm_param(cfg)
    shapes: dict[str, tuple[int, ...]] = {"tok_emb.weight": (v, e)}
    for i in range(cfg.n_layers):
        p = f"trf_blocks.{i}."
        shapes |= {f"{p}att.W_query.weight": (q, e), f"{p}att.W_key.weight": (kv, e),
                   f"{p}att.W_value.weight": (kv, e), f"{p}att.out_proj.weight": (e, q)}
        if cfg.qk_norm:
            shapes |= {f"{p}att.q_norm.scale": (d,), f"{p}att.k_norm.scale": (d,)}
        shapes |= {f"{p}ff.fc1.weight": (f, e), f"{p}ff.fc2.weight": (f, e), f"{p}ff.fc3.weight": (e, f),
                   f"{p}norm1.{n}": (e,), f"{p}norm2.{n}": (e,)}
    return shapes | {f"final_norm.{n}": (e,), HEAD: (v, e)}


def hf_names(cfg: RotaryConfig, prefix: str) -> dict[str, str]:
    """book key -> Hugging Face key (the same matrices, Linear (out, in) in both: nothing is transposed or split;
    the book's RoPE rotates halves as transformers' rotate_half does)."""
    n = norm_param(cfg)
    names = {"tok_emb.weight": f"{prefix}embed_tokens.weight", f"final_norm.{n}": f"{prefix}norm.weight",
             HEAD: HF_HEAD}
    for i in range(cfg.n_layers):
        b, h = f"trf_blocks.{i}.", f"{prefix}layers.{i}."
        names |= {f"{b}att.W_query.weight": f"{h}self_attn.q_proj.weight",
                  f"{b}att.W_key.weight": f"{h}self_attn.k_proj.weight",
                  f"{b}att.W_value.weight": f"{h}self_attn.v_proj.weight",
                  f"{b}att.out_proj.weight": f"{h}self_attn.o_proj.weight",
                  f"{b}ff.fc1.weight": f"{h}mlp.gate_proj.weight", f"{b}ff.fc2.weight": f"{h}mlp.up_proj.weight",
                  f"{b}ff.fc3.weight": f"{h}mlp.down_proj.weight",
                  f"{b}norm1.{n}": f"{h}input_layernorm.weight", f"{b}norm2.{n}": f"{h}post_attention_layernorm.weight"}
        if cfg.qk_norm:
            names |= {f"{b}att.q_norm.scale": f"{h}self_attn.q_norm.weight",
                      f"{b}att.k_norm.scale": f"{h}self_attn.k_norm.weight"}
    return names


def describe(cfg: RotaryConfig) -> str:
    """The config's deciding fields, for a weights error."""
    return (f"vocab_size={cfg.vocab_size}, emb_dim={cfg.emb_dim}, n_heads={cfg.n_heads}, "
            f"n_kv_groups={cfg.n_kv_groups}, head_dim={cfg.head_dim}, hidden_dim={cfg.hidden_dim}, "
            f"n_layers={cfg.n_layers}" + (f", qk_norm={str(cfg.qk_norm).lower()}" if cfg.arch == "qwen3" else ""))
