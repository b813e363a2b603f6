"""llama.cpp's side of Gemma 3: its `gemma3` architecture's metadata keys and tensor names (src/models/gemma3.cpp and
conversion/gemma.py's Gemma3Model of the pinned tree), from and onto the book's keys.

- Names: token_embd, blk.N.attn_norm, attn_q, attn_k, attn_v, attn_q_norm, attn_k_norm, attn_output,
  post_attention_norm, ffn_norm, ffn_gate, ffn_up, ffn_down, post_ffw_norm, output_norm, and output only where the
  head is not the token embedding.
- llama.cpp's gemma3 multiplies by its norms' weights as they are: the converter stores every `*norm.weight` as
  1 + w (norm_shift), and read_gguf subtracts the 1 again (as transformers' Gemma2TensorProcessor does). In float32
  1 + w rounds to 2^-24 absolute: a zero-centred w below that is not kept. It rotates halves (NEOX), as the book
  does: no q/k rows are permuted.
- Per layer: llama.cpp reads `attention.sliding_window_pattern` (an int n: every n-th layer global; or one bool per
  layer, true for local; default 6) and `rope.freq_base_swa` (the local base; default 10,000). The converter
  writes neither for Gemma 3 (its files take the defaults); gguf_metadata writes both, so any layer_types and local
  base run as said. transformers' GGUF loader (5.24) reads neither and takes the same defaults.
- llama.cpp scales queries by head_dim ** -0.5 (emb_dim / n_heads for the 62-block 27B), not by the config's
  query_pre_attn_scalar: a config whose scalar differs cannot be a GGUF (refusal), and one read from a GGUF has
  llama.cpp's (transformers' loader takes Gemma3TextConfig's 256, the same for every size but the 27B).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from mha_export.decoder.archs.gemma3.config import FULL, PATTERN, SLIDING, Gemma3Config, pattern_layers
from mha_export.decoder.archs.gemma3.keys import HEAD, NORMS
from mha_runtime.artifact.errors import BadValueError, ConfigError

if TYPE_CHECKING:
    import gguf

    from mha_export.decoder.archs.protocol import Tensors

ARCH = "gemma3"
# book suffix (after blocks.N.) -> llama.cpp's name (after blk.N.)
BLOCK = {"att.W_query.weight": "attn_q.weight", "att.W_key.weight": "attn_k.weight",
         "att.W_value.weight": "attn_v.weight", "att.out_proj.weight": "attn_output.weight",
         "att.q_norm.scale": "attn_q_norm.weight", "att.k_norm.scale": "attn_k_norm.weight",
         "ff.fc1.weight": "ffn_gate.weight", "ff.fc2.weight": "ffn_up.weight", "ff.fc3.weight": "ffn_down.weight"}
BLOCK |= dict(zip((f"{n}.scale" for n in NORMS), ("attn_norm.weight", "post_attention_norm.weight",
                                                  "ffn_norm.weight", "post_ffw_norm.weight"), strict=True))
LAYERS_27B = 62  # llama.cpp's LLM_TYPE_27B, whose queries are scaled by emb_dim / n_heads


def names(cfg: Gemma3Config) -> dict[str, str]:
    """book key -> GGUF name, the head as `output.weight`."""
    out = {"tok_emb.weight": "token_embd.weight", "final_norm.scale": "output_norm.weight", HEAD: "output.weight"}
    for i in range(cfg.n_layers):
        out |= {f"blocks.{i}.{b}": f"blk.{i}.{g}" for b, g in BLOCK.items()}
    return out


def _is_norm(book: str) -> bool:
    return book.endswith(".scale")


def query_scalar(emb_dim: int, n_heads: int, head_dim: int, n_layers: int) -> int:
    """The query_pre_attn_scalar llama.cpp's gemma3 computes with (f_attention_scale = its -0.5 power)."""
    return emb_dim // n_heads if n_layers == LAYERS_27B else head_dim


def gguf_tensors(state: Tensors, cfg: Gemma3Config, *, tied: bool) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (rows first, as the book's Linear weights are (out, in)): the book's tensors
    under llama.cpp's names, every norm as 1 + w (summed in float64, stored as float32)."""
    import torch

    out: dict[str, np.ndarray] = {}
    for book, name in names(cfg).items():
        if book == HEAD and tied:
            continue
        tensor = state[book].detach()
        if _is_norm(book):
            out[name] = (tensor.to(torch.float64) + 1.0).to(torch.float32).contiguous().numpy()
        else:
            out[name] = tensor.to(torch.float32).contiguous().numpy()
    return out


def read_gguf(tensors: Mapping[str, np.ndarray], cfg: Gemma3Config) -> tuple[Tensors, bool]:
    """gguf_tensors' inverse: a GGUF's (dequantized) tensors onto the book's keys, 1 taken from every norm; the
    head tied where the file has no output.weight."""
    import torch

    where = f"GGUF ({ARCH})"
    extra = sorted(set(tensors) - set(names(cfg).values()))
    if extra:
        raise ConfigError(f"{where}: unexpected tensor {extra[0]!r} for llama.cpp's {ARCH} with {cfg.n_layers} blocks")
    state: Tensors = {}
    for book, name in names(cfg).items():
        if name not in tensors:
            if book == HEAD:
                continue
            raise ConfigError(f"{where}: missing tensor {name!r}")
        array = np.asarray(tensors[name], dtype=np.float32)
        if _is_norm(book):
            array = (array.astype(np.float64) - 1.0).astype(np.float32)
        state[book] = torch.from_numpy(np.ascontiguousarray(array))
    tied = "output.weight" not in tensors
    if tied:
        state[HEAD] = state["tok_emb.weight"]
    return state, tied


def gguf_metadata(writer: gguf.GGUFWriter, cfg: Gemma3Config) -> None:
    """The architecture's keys as llama.cpp's converter writes them for a Gemma3ForCausalLM, and the two it reads
    that the converter leaves to their defaults: the local layers (one bool per layer) and the local RoPE base."""
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.emb_dim)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(cfg.hidden_dim)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_freq_base(float(cfg.rope_base))
    writer.add_rope_freq_base_swa(float(cfg.rope_local_base))
    writer.add_sliding_window(cfg.sliding_window)
    writer.add_sliding_window_pattern([t == SLIDING for t in cfg.layer_types])


def _f32(value: float) -> float:
    """A float32 metadata value as the decimal that was written (1e-06, not 9.999999974752427e-07)."""
    return float(str(np.float32(value)))


def _layer_types(said: Any, n_layers: int) -> tuple[str, ...]:
    """llama.cpp's load_swa_pattern: one bool per layer (true: local), or every n-th layer global."""
    key = f"{ARCH}.attention.sliding_window_pattern"
    if isinstance(said, (list, tuple)):
        if len(said) != n_layers or not all(isinstance(v, (bool, int, np.integer)) for v in said):
            raise BadValueError(f"GGUF metadata: {key} {str(said)[:40]}; expected one bool per block ({n_layers})")
        return tuple(SLIDING if v else FULL for v in said)
    if isinstance(said, bool) or not isinstance(said, int) or said < 0:
        raise BadValueError(f"GGUF metadata: {key} {str(said)[:40]}; expected a pattern (an integer) or one bool "
                            "per block")
    return pattern_layers(n_layers, said)


def config_from_gguf(fields: Mapping[str, Any]) -> Gemma3Config:
    """llama.cpp's gemma3 keys onto the book's config, as llama.cpp's loader reads them (transformers' GGUF loader
    maps the same keys and takes the same defaults). The vocabulary is the token list's length, or
    `gemma3.vocab_size` in a file without one; head_count_kv defaults to head_count and key_length to
    embedding_length / head_count, as llama.cpp's loader does. A file without a sliding window (llama.cpp then
    attends globally everywhere) or with soft-capped logits is refused."""
    import gguf

    def get(key: str, default: Any = ...) -> Any:
        name = key.format(arch=ARCH)
        if name not in fields:
            if default is ...:
                raise BadValueError(f"GGUF metadata: missing {name!r} of llama.cpp's {ARCH} architecture")
            return default
        value = fields[name]
        if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
            raise BadValueError(f"GGUF metadata: {name} {str(value)[:40]}; expected one number (per-layer values "
                                "are not supported)")
        return value.item() if isinstance(value, np.generic) else value

    k = gguf.Keys
    cap = fields.get(k.LLM.FINAL_LOGIT_SOFTCAPPING.format(arch=ARCH))
    if cap not in (None, 0, 0.0):
        raise BadValueError(f"GGUF metadata: {k.LLM.FINAL_LOGIT_SOFTCAPPING.format(arch=ARCH)} {cap}; the book's "
                            "Gemma 3 has no soft-capping")
    window = get(k.Attention.SLIDING_WINDOW)
    tokens = fields.get(k.Tokenizer.LIST)
    heads, width, layers = get(k.Attention.HEAD_COUNT), get(k.LLM.EMBEDDING_LENGTH), get(k.LLM.BLOCK_COUNT)
    size = get(k.Attention.KEY_LENGTH, width // heads if isinstance(heads, int) and heads > 0 else None)
    for key, said in ((k.Attention.VALUE_LENGTH, get(k.Attention.VALUE_LENGTH, size)),
                      (k.Rope.DIMENSION_COUNT, get(k.Rope.DIMENSION_COUNT, size))):
        if said != size:
            raise BadValueError(f"GGUF metadata: {key.format(arch=ARCH)} {said}; expected the key length "
                                f"{size} (the book's RoPE rotates the whole head, values as wide as keys)")
    pattern = fields.get(k.Attention.SLIDING_WINDOW_PATTERN.format(arch=ARCH), PATTERN)
    types = _layer_types(pattern, layers) if isinstance(layers, int) and layers > 0 else ()
    ints = all(isinstance(v, int) and v > 0 for v in (width, heads, size, layers))
    return Gemma3Config(
        vocab_size=len(tokens) if tokens is not None else get(k.LLM.VOCAB_SIZE),
        context_length=get(k.LLM.CONTEXT_LENGTH), emb_dim=width, n_heads=heads, n_layers=layers,
        hidden_dim=get(k.LLM.FEED_FORWARD_LENGTH), head_dim=size,
        n_kv_groups=get(k.Attention.HEAD_COUNT_KV, heads),
        rope_base=_f32(get(k.Rope.FREQ_BASE)), rope_local_base=_f32(get(k.Rope.FREQ_BASE_SWA, 10_000.0)),
        sliding_window=window, layer_types=types,
        query_pre_attn_scalar=query_scalar(width, heads, size, layers) if ints else size,
        rms_norm_eps=_f32(get(k.Attention.LAYERNORM_RMS_EPS)))
