"""llama.cpp's side of the Llama family: its `llama` and `qwen3` architectures' metadata keys and tensor names
(src/models/llama.cpp and qwen3.cpp of the pinned tree), from and onto the book's keys.

- Names: token_embd, blk.N.attn_norm, attn_q, attn_k, attn_v, attn_output, (qwen3: attn_q_norm, attn_k_norm),
  ffn_norm, ffn_gate, ffn_up, ffn_down, output_norm, and output only where the head is not the token embedding.
- llama.cpp's `llama` rotates adjacent pairs (LLAMA_ROPE_TYPE_NORM) where the book and transformers rotate halves:
  its converter permutes attn_q's and attn_k's rows per head (convert_hf_to_gguf.py's LlamaModel.permute), and
  read_gguf undoes that. `qwen3` rotates halves (NEOX): nothing is permuted.
- Llama 3's frequency scaling is the tensor rope_freqs.weight (head_dim / 2 factors that divide each frequency), as
  the converter's generate_extra_tensors writes it; no metadata key says it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from mha_export.decoder.archs.llama.config import LlamaConfig, Qwen3Config, RotaryConfig
from mha_export.decoder.archs.llama.keys import HEAD, norm_param
from mha_runtime.artifact.errors import BadValueError, ConfigError

if TYPE_CHECKING:
    import gguf

    from mha_export.decoder.archs.protocol import Tensors

ROPE_FREQS = "rope_freqs.weight"
# book suffix (after trf_blocks.N.) -> llama.cpp's name (after blk.N.); the norms' suffix is the family's.
BLOCK = {"att.W_query.weight": "attn_q.weight", "att.W_key.weight": "attn_k.weight",
         "att.W_value.weight": "attn_v.weight", "att.out_proj.weight": "attn_output.weight",
         "ff.fc1.weight": "ffn_gate.weight", "ff.fc2.weight": "ffn_up.weight", "ff.fc3.weight": "ffn_down.weight",
         "norm1.{n}": "attn_norm.weight", "norm2.{n}": "ffn_norm.weight"}
QK_NORMS = {"att.q_norm.scale": "attn_q_norm.weight", "att.k_norm.scale": "attn_k_norm.weight"}


def names(cfg: RotaryConfig) -> dict[str, str]:
    """book key -> GGUF name, the head as `output.weight`."""
    n = norm_param(cfg)
    out = {"tok_emb.weight": "token_embd.weight", f"final_norm.{n}": "output_norm.weight", HEAD: "output.weight"}
    block = BLOCK | (QK_NORMS if cfg.qk_norm else {})
    for i in range(cfg.n_layers):
        out |= {f"trf_blocks.{i}.{b.format(n=n)}": f"blk.{i}.{g}" for b, g in block.items()}
    return out


def permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """Each head's rows from halves (x0..x(D/2-1), then the rest) to pairs (x0, xD/2, x1, ...): (heads * D, E)."""
    d = rows.shape[0] // heads
    return rows.reshape(heads, 2, d // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def unpermute(rows: np.ndarray, heads: int) -> np.ndarray:
    """permute's inverse: (heads * D, E) from pairs back to halves."""
    d = rows.shape[0] // heads
    return rows.reshape(heads, d // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def rope_factors(cfg: RotaryConfig) -> np.ndarray | None:
    """Llama 3's per-frequency divisors (head_dim / 2,) as llama.cpp's rope_freqs tensor holds them, or None."""
    freq = getattr(cfg, "rope_freq", None)
    if not freq:
        return None
    d = cfg.head_dim
    inv = 1.0 / (float(cfg.rope_base) ** (np.arange(0, d, 2, dtype=np.float32) / d))  # (D/2,)
    context, factor = freq["original_context_length"], freq["factor"]
    low, high = freq["low_freq_factor"], freq["high_freq_factor"]
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < context / high:
            out.append(1.0)
        elif wavelen > context / low:
            out.append(factor)
        else:
            smooth = (context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def gguf_tensors(state: Tensors, cfg: RotaryConfig, *, tied: bool) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (rows first, as the book's Linear weights are (out, in)): the book's tensors
    under llama.cpp's names, llama's attn_q / attn_k permuted, rope_freqs where Llama 3's scaling applies."""
    import torch

    out: dict[str, np.ndarray] = {}
    for book, name in names(cfg).items():
        if book == HEAD and tied:
            continue
        array = state[book].detach().to(torch.float32).contiguous().numpy()
        if cfg.arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            array = permute(array, cfg.n_heads if name.endswith("attn_q.weight") else cfg.kv_heads)
        out[name] = array
    factors = rope_factors(cfg)
    if factors is not None:
        out[ROPE_FREQS] = factors
    return out


def read_gguf(tensors: Mapping[str, np.ndarray], cfg: RotaryConfig) -> tuple[Tensors, bool]:
    """gguf_tensors' inverse: a GGUF's (dequantized) tensors onto the book's keys, llama's q/k rows un-permuted; the
    head tied where the file has no output.weight. A rope_freqs tensor must be the config's Llama 3 scaling."""
    import torch

    where = f"GGUF ({cfg.arch})"
    known = set(names(cfg).values()) | {ROPE_FREQS}
    extra = sorted(set(tensors) - known)
    if extra:
        raise ConfigError(f"{where}: unexpected tensor {extra[0]!r} for llama.cpp's {cfg.arch} with "
                          f"{cfg.n_layers} blocks{'' if cfg.qk_norm else ' and no q/k norms'}")
    state: Tensors = {}
    for book, name in names(cfg).items():
        if name not in tensors:
            if book == HEAD:
                continue
            raise ConfigError(f"{where}: missing tensor {name!r}")
        array = np.asarray(tensors[name], dtype=np.float32)
        if cfg.arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")) and array.ndim == 2:
            heads = cfg.n_heads if name.endswith("attn_q.weight") else cfg.kv_heads
            if array.shape[0] % (2 * heads) == 0:  # else the caller's shape check names it
                array = unpermute(array, heads)
        state[book] = torch.from_numpy(np.ascontiguousarray(array))
    tied = "output.weight" not in tensors
    if tied:
        state[HEAD] = state["tok_emb.weight"]
    _check_rope_freqs(tensors.get(ROPE_FREQS), cfg, where)
    return state, tied


def _check_rope_freqs(given: np.ndarray | None, cfg: RotaryConfig, where: str) -> None:
    want = rope_factors(cfg)
    if given is None and want is None:
        return
    if given is None:
        raise ConfigError(f"{where}: no tensor {ROPE_FREQS!r}, but the config scales RoPE's frequencies (rope_freq)")
    if want is None:
        want = np.ones(cfg.head_dim // 2, np.float32)
    if np.shape(given) != want.shape or not np.allclose(np.asarray(given, np.float32), want, rtol=1e-5, atol=0):
        raise ConfigError(f"{where}: tensor {ROPE_FREQS!r} scales RoPE's frequencies other than the config's "
                          f"rope_freq {getattr(cfg, 'rope_freq', None)} (Llama 3's scaling, computed as llama.cpp's "
                          "converter does)")


def gguf_metadata(writer: gguf.GGUFWriter, cfg: RotaryConfig) -> None:
    """The architecture's keys, as llama.cpp's converter writes them for a LlamaForCausalLM / Qwen3ForCausalLM."""
    writer.add_context_length(cfg.context_length)
    writer.add_embedding_length(cfg.emb_dim)
    writer.add_block_count(cfg.n_layers)
    writer.add_feed_forward_length(cfg.hidden_dim)
    writer.add_head_count(cfg.n_heads)
    writer.add_head_count_kv(cfg.kv_heads)
    writer.add_rope_freq_base(float(cfg.rope_base))
    writer.add_layer_norm_rms_eps(cfg.norm_eps)
    writer.add_key_length(cfg.head_dim)
    writer.add_value_length(cfg.head_dim)
    writer.add_rope_dimension_count(cfg.head_dim)


def _f32(value: float) -> float:
    """A float32 metadata value as the decimal that was written (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))


def config_from_gguf(fields: Mapping[str, Any], arch: str) -> RotaryConfig:
    """llama.cpp's llama / qwen3 keys onto the book's config (transformers' GGUF loader maps the same keys). The
    vocabulary is the token list's length, or `{arch}.vocab_size` in a file without one; head_count_kv defaults to
    head_count and rope.freq_base to 10,000, as llama.cpp's loader does. Llama 3's scaling (a rope_freqs tensor) is
    not in the metadata: rope_freq_of gives the config from that tensor."""
    import gguf

    def get(key: str, default: Any = ...) -> Any:
        name = key.format(arch=arch)
        if name not in fields:
            if default is ...:
                raise BadValueError(f"GGUF metadata: missing {name!r} of llama.cpp's {arch} architecture")
            return default
        value = fields[name]
        if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
            raise BadValueError(f"GGUF metadata: {name} {str(value)[:40]}; expected one number (per-layer values "
                                "are not supported)")
        return value.item() if isinstance(value, np.generic) else value

    k = gguf.Keys
    for key in (k.LLM.EXPERT_COUNT, k.Rope.SCALING_TYPE, k.Attention.SLIDING_WINDOW):
        said = fields.get(key.format(arch=arch))
        if said not in (None, 0, "none"):
            raise BadValueError(f"GGUF metadata: {key.format(arch=arch)} {str(said)[:40]}; the book's {arch} model "
                                "has no experts, no RoPE scaling type and no sliding window")
    tokens = fields.get(k.Tokenizer.LIST)
    heads, width = get(k.Attention.HEAD_COUNT), get(k.LLM.EMBEDDING_LENGTH)
    head_dim = get(k.Attention.KEY_LENGTH, None)
    size = head_dim if head_dim is not None else width // heads if heads else None  # llama.cpp's n_embd_head_k
    for key, said in ((k.Attention.VALUE_LENGTH, get(k.Attention.VALUE_LENGTH, size)),
                      (k.Rope.DIMENSION_COUNT, get(k.Rope.DIMENSION_COUNT, size))):
        if said != size:
            raise BadValueError(f"GGUF metadata: {key.format(arch=arch)} {said}; expected the key length "
                                f"{size} (the book's RoPE rotates the whole head, values as wide as keys)")
    common: dict[str, Any] = {
        "vocab_size": len(tokens) if tokens is not None else get(k.LLM.VOCAB_SIZE),
        "context_length": get(k.LLM.CONTEXT_LENGTH), "emb_dim": width, "n_heads": heads,
        "n_layers": get(k.LLM.BLOCK_COUNT), "hidden_dim": get(k.LLM.FEED_FORWARD_LENGTH),
        "n_kv_groups": get(k.Attention.HEAD_COUNT_KV, heads), "rope_base": _f32(get(k.Rope.FREQ_BASE, 10_000.0)),
        "rms_norm_eps": _f32(get(k.Attention.LAYERNORM_RMS_EPS))}
    if arch == "qwen3":
        return Qwen3Config(**common, head_dim_=head_dim, qk_norm_=True)
    if head_dim is not None and head_dim * heads != width:
        raise BadValueError(f"GGUF metadata: {k.Attention.KEY_LENGTH.format(arch=arch)} {head_dim}; expected "
                            f"{width // heads} (embedding_length / head_count, the book's Llama3Model's head size)")
    return LlamaConfig(**common)


def rope_freq_of(factors: np.ndarray, cfg: LlamaConfig) -> LlamaConfig:
    """The config with the Llama 3 scaling whose factors are `factors` (a GGUF's rope_freqs tensor, which is all
    that file says of it). The factors fix the two wavelength bounds, not the three numbers: low_freq_factor 1 (every
    Llama 3's) is taken and the others follow from the smoothly scaled frequencies between the bounds (two at least);
    the result must reproduce the tensor or the file is refused."""
    import dataclasses

    given = np.asarray(factors, dtype=np.float64)
    where = f"GGUF (llama): tensor {ROPE_FREQS!r}"
    if given.shape != (cfg.head_dim // 2,):
        raise ConfigError(f"{where} has shape {list(given.shape)}, expected [{cfg.head_dim // 2}]")
    if np.allclose(given, 1.0):
        return dataclasses.replace(cfg, rope_freq=None)
    d, factor = cfg.head_dim, float(given.max())
    wavelen = 2 * math.pi * float(cfg.rope_base) ** (np.arange(0, d, 2, dtype=np.float64) / d)  # (D/2,)
    medium = ~np.isclose(given, 1.0) & ~np.isclose(given, factor)
    freq = None
    if factor > 1 and medium.sum() >= 2:
        smooth = (1 / given[medium] - 1 / factor) / (1 - 1 / factor)  # linear in 1 / wavelen
        slope, intercept = np.polyfit(1 / wavelen[medium], smooth, 1)
        high = 1 - 1 / intercept  # intercept = -low / (high - low), low = 1
        context = slope * (high - 1)
        for digits in range(7):  # the shortest decimals that reproduce the tensor (16.0, not 15.999999)
            freq = {"factor": round(factor, digits), "low_freq_factor": 1.0,
                    "high_freq_factor": round(float(high), digits), "original_context_length": round(float(context))}
            if np.allclose(rope_factors(dataclasses.replace(cfg, rope_freq=freq)), given, rtol=1e-5, atol=0):
                break
    fitted = None if freq is None else dataclasses.replace(cfg, rope_freq=freq)
    if fitted is None or not np.allclose(rope_factors(fitted), given, rtol=1e-5, atol=0):
        raise ConfigError(f"{where} is not Llama 3's frequency scaling (with low_freq_factor 1), which the book's "
                          "Llama3Model computes")
    return fitted
