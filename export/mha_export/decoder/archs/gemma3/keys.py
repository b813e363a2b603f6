"""Gemma 3's weight names, torch-free: the book's Gemma3Model state_dict keys (canonical) with their shapes, and
Hugging Face's Gemma3ForCausalLM keys onto them.

The book's names are its own, not the Llama family's: the blocks are `blocks.N` (not trf_blocks.N), its four norms
per block keep Hugging Face's names (input_layernorm, post_attention_layernorm, pre_feedforward_layernorm,
post_feedforward_layernorm), every RMSNorm's parameter is `scale` and holds Gemma's zero-centred w (the norm
multiplies by 1 + w). The feed-forward is GeGLU: fc1 the gate, fc2 the up projection, fc3 the down projection.
"""
from __future__ import annotations

import re

from mha_export.decoder.archs.gemma3.config import Gemma3Config

HEAD = "out_head.weight"
NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
# Buffers, not parameters: the book's rope tables (persistent=False there, but a standalone notebook's save may
# hold them) and transformers' embed_scale / per-type inv_freq (persistent=False in 5.24; older saves held them).
BUFFERS = re.compile(r"(cos|sin)_(local|global)"
                     r"|(model\.)?(embed_tokens\.embed_scale|rotary_emb(_local)?\.\w*inv_freq)")
# Hugging Face's token embedding: the signature of its checkpoint (Gemma3ForCausalLM: 'model.' before it; the bare
# Gemma3TextModel: none).
HF_SIGNATURE = re.compile(r"(model\.)?embed_tokens\.weight")
HF_HEAD = "lm_head.weight"  # never under the prefix


def book_shapes(cfg: Gemma3Config) -> dict[str, tuple[int, ...]]:
    """Every parameter of the book's model for `cfg`, with its shape (Linear weights (out, in))."""
    e, v, d, f = cfg.emb_dim, cfg.vocab_size, cfg.head_dim, cfg.hidden_dim
    q, kv = cfg.n_heads * d, cfg.kv_heads * d
    shapes: dict[str, tuple[int, ...]] = {"tok_emb.weight": (v, e)}
    for i in range(cfg.n_layers):
        p = f"blocks.{i}."
        shapes |= {f"{p}att.W_query.weight": (q, e), f"{p}att.W_key.weight": (kv, e),
                   f"{p}att.W_value.weight": (kv, e), f"{p}att.out_proj.weight": (e, q),
                   f"{p}att.q_norm.scale": (d,), f"{p}att.k_norm.scale": (d,),
                   f"{p}ff.fc1.weight": (f, e), f"{p}ff.fc2.weight": (f, e), f"{p}ff.fc3.weight": (e, f)}
        shapes |= {f"{p}{n}.scale": (e,) for n in NORMS}
    return shapes | {"final_norm.scale": (e,), HEAD: (v, e)}


def hf_names(cfg: Gemma3Config, prefix: str) -> dict[str, str]:
    """book key -> Hugging Face key (the same tensors: Linear (out, in) in both, the norms' zero-centred w in both;
    the book's RoPE rotates halves as transformers' rotate_half does)."""
    names = {"tok_emb.weight": f"{prefix}embed_tokens.weight", "final_norm.scale": f"{prefix}norm.weight",
             HEAD: HF_HEAD}
    for i in range(cfg.n_layers):
        b, h = f"blocks.{i}.", f"{prefix}layers.{i}."
        names |= {f"{b}att.W_query.weight": f"{h}self_attn.q_proj.weight",
                  f"{b}att.W_key.weight": f"{h}self_attn.k_proj.weight",
                  f"{b}att.W_value.weight": f"{h}self_attn.v_proj.weight",
                  f"{b}att.out_proj.weight": f"{h}self_attn.o_proj.weight",
                  f"{b}att.q_norm.scale": f"{h}self_attn.q_norm.weight",
                  f"{b}att.k_norm.scale": f"{h}self_attn.k_norm.weight",
                  f"{b}ff.fc1.weight": f"{h}mlp.gate_proj.weight", f"{b}ff.fc2.weight": f"{h}mlp.up_proj.weight",
                  f"{b}ff.fc3.weight": f"{h}mlp.down_proj.weight"}
        names |= {f"{b}{n}.scale": f"{h}{n}.weight" for n in NORMS}
    return names


def describe(cfg: Gemma3Config) -> str:
    """The config's deciding fields, for a weights error."""
    return (f"vocab_size={cfg.vocab_size}, emb_dim={cfg.emb_dim}, n_heads={cfg.n_heads}, "
            f"n_kv_groups={cfg.n_kv_groups}, head_dim={cfg.head_dim}, hidden_dim={cfg.hidden_dim}, "
            f"n_layers={cfg.n_layers}")
