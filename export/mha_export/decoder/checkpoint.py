"""What comes with the weights: the config (a Hugging Face checkpoint's config.json, whose model_type names the
architecture; the book's config dict, whose keys name it; a GGUF's metadata, whose general.architecture names it)
and, from a Hugging Face checkpoint, its eos and bos ids, the config.json fields its architecture carries (GPT-2's
dropouts), its generation defaults (generation_config.json), and its tokenizer (tokenizer.json).

Decisions:
- The eos ids are generation_config.json's `eos_token_id` when it has one (transformers' generate reads that file
  first), else config.json's; one id or a list (Hugging Face allows both). A key that is absent is the
  architecture's Hugging Face default (its HF_DEFAULTS: GPT2Config's 50256); `null` is none. Ids outside the
  vocabulary are dropped from what the runtimes stop at: the model can never produce them (transformers' GPT2Config
  writes 50256 into the config.json of a smaller vocabulary), and the folder's config files still say what the
  checkpoint said.
- Without a checkpoint (a preset, gpt.json, the book's .pth) the folder says what it always said: the
  architecture's default (GPT-2's 50256) when the vocabulary has it (`default_origin`), byte for byte.
- A generation default the runtimes do not implement is one note at export, not a failure: the exported forms
  are exact, Hugging Face's clients read the setting from the folder's generation_config.json as transformers reads
  the checkpoint's, and `mha generate`, serve and the native runners say in that note what they do instead.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mha_export.decoder.archs import arch_named, arch_of, by_gguf_arch, config_from_dict, hf_arch
from mha_export.decoder.archs.protocol import DecoderConfig
from mha_export.gguf.source import gguf_ids, is_gguf, metadata
from mha_runtime.artifact.config_fields import read_config_json
from mha_runtime.artifact.errors import ConfigError
from mha_runtime.artifact.manifest import DECODER_KIND, folder_kind
from mha_runtime.decoder.contract import GENERATION_CONFIG, HF_CONFIG, TOKENIZER_FILE
from mha_runtime.decoder.manifest import MAX_EOS_IDS

# What --config expects, for the line when nothing is there.
CONFIG_WHAT = "a JSON file of the book's config keys (gpt.json) or a Hugging Face config.json"


@dataclass(frozen=True)
class Origin:
    """The folder's generation facts: the eos ids the runtimes stop at (in the vocabulary), the bos id, the
    checkpoint's config.json fields carried as said, its generation_config.json as said (None: write the default)
    and the lines the export prints about them."""

    eos_ids: tuple[int, ...]
    bos_id: int | None
    carried: dict[str, Any] = field(default_factory=dict)
    generation: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()

    @property
    def eos_id(self) -> int | None:
        """The first eos id: the manifest's `eos_id`, which folders made before `eos_ids` hold alone."""
        return self.eos_ids[0] if self.eos_ids else None


def default_origin(cfg: DecoderConfig) -> Origin:
    """A model with no checkpoint config: the architecture's default eos (GPT-2's <|endoftext|>) as bos and eos when
    the vocabulary has it."""
    eos: int | None = arch_of(cfg).HF_DEFAULTS["eos_token_id"]
    eos = eos if eos is not None and cfg.vocab_size > eos else None
    return Origin(eos_ids=() if eos is None else (eos,), bos_id=eos)


def read_origin(hf_config: Path, cfg: DecoderConfig, *, flag: str) -> Origin:
    """The origin of a model whose config came from the Hugging Face `hf_config` (a checkpoint's config.json, or
    --config naming one: `flag`), with the generation_config.json beside it. A bad file is one ConfigError
    (exit 1)."""
    own = read_json(hf_config, flag)
    arch = arch_of(cfg)
    defaults = arch.HF_DEFAULTS
    gen_path = hf_config.parent / GENERATION_CONFIG
    generation = read_json(gen_path, "the checkpoint's") if gen_path.is_file() else None
    from_gen = generation is not None and "eos_token_id" in generation
    said, where = (generation or {}, gen_path) if from_gen else (own, hf_config)
    eos = said.get("eos_token_id", defaults["eos_token_id"])
    listed = [] if eos is None else eos if isinstance(eos, list) else [eos]
    if not all(_is_id(i) for i in listed) or len(listed) > MAX_EOS_IDS:
        raise ConfigError(f"{where}: eos_token_id {json.dumps(eos)[:60]}; expected a token id, a list of at most "
                          f"{MAX_EOS_IDS} token ids, or null")
    bos_said = (generation or {}).get("bos_token_id", own.get("bos_token_id", defaults["bos_token_id"]))
    bos = bos_said if _is_id(bos_said) and bos_said < cfg.vocab_size else None
    eos_ids = tuple(dict.fromkeys(i for i in listed if i < cfg.vocab_size))
    notes = [] if generation is None else [n for n in [unhonoured(generation, gen_path)] if n]
    return Origin(eos_ids=eos_ids, bos_id=bos, carried={k: own[k] for k in arch.HF_CARRIED if k in own},
                  generation=generation if generation is not None else
                  {k: own[k] for k in ("bos_token_id", "eos_token_id") if k in own}, notes=tuple(notes))


def unhonoured(generation: dict[str, Any], where: Path) -> str | None:
    """One line naming the generation defaults of `generation` that `mha generate`, serve and the native runners do
    not apply, or None. They change what transformers generates; the exported forms are exact whatever they say."""
    said = []
    for key, plain in (("num_beams", 1), ("repetition_penalty", 1.0), ("no_repeat_ngram_size", 0),
                       ("min_length", 0), ("min_new_tokens", None), ("bad_words_ids", None),
                       ("suppress_tokens", None), ("begin_suppress_tokens", None), ("forced_bos_token_id", None),
                       ("forced_eos_token_id", None), ("sequence_bias", None)):
        value = generation.get(key)
        if value is not None and value != plain and value != []:
            said.append(f"{key} {json.dumps(generation[key])[:40]}")
    if generation.get("do_sample") is True:
        sampling = {k: generation[k] for k in ("temperature", "top_k", "top_p") if k in generation}
        said.append("do_sample true" + "".join(f", {k} {json.dumps(v)}" for k, v in sampling.items()))
    if not said:
        return None
    return (f"{where} sets {'; '.join(said)}: mha generate, mha serve and the native runners do not apply "
            "it (greedy unless --temperature / --top-k are given); Hugging Face's clients read it from the folder's "
            "generation_config.json")


def checkpoint_config(weights: Path | None) -> Path | None:
    """The checkpoint's own config.json beside --weights; not the one in a decoder folder of `mha export` (its
    gpt.safetensors has the book's keys, its config.json is Optimum's and transformers.js' view of gpt.onnx:
    mha_export.decoder.hf_files), whose weights take --config or --preset as before. A GGUF is its own config (its
    metadata), whatever lies beside it."""
    if weights is not None and is_gguf(weights):
        return Path(weights)
    if weights is None or not (Path(weights).parent / HF_CONFIG).is_file():
        return None
    return None if folder_kind(Path(weights).parent) == DECODER_KIND else Path(weights).parent / HF_CONFIG


def beside_tokenizer(weights: Path | None) -> Path | None:
    """The tokenizer.json save_pretrained wrote beside the weights, taken as their config.json is (not a decoder
    folder's own, as its config.json is not)."""
    if weights is None or is_gguf(weights) or not (Path(weights).parent / TOKENIZER_FILE).is_file():
        return None
    return None if folder_kind(Path(weights).parent) == DECODER_KIND else Path(weights).parent / TOKENIZER_FILE


def origin_for(cfg: DecoderConfig, weights: Path | None, config_path: Path | None) -> Origin:
    """The folder's generation facts: from the checkpoint's own config.json beside the weights, else from a
    Hugging Face config.json given as --config, else the architecture's default (default_origin)."""
    own = checkpoint_config(weights)
    if own is not None and is_gguf(own):
        return gguf_origin(own, cfg)
    path, flag = (own, "the checkpoint's") if own is not None else (config_path, "--config")
    if path is None or hf_arch(read_json(path, flag)) is None:  # the book's keys (gpt.json)
        return default_origin(cfg)
    return read_origin(path, cfg, flag=flag)


def read_config(path: Path, *, flag: str, own: bool = False, arch: str | None = None) -> DecoderConfig:
    """The decoder config in `path`: a Hugging Face config.json (its model_type names the architecture) or the
    book's config dict (its keys name it). `own`: the checkpoint's config.json beside the weights, which the user did
    not name, so a file that is not JSON or has a duplicate key is a bad file (exit 1) alike; a value the
    architecture cannot take keeps its kind (a bad value, exit 2), as does an unknown architecture. `arch` (--arch)
    names the architecture of the book's keys, which several families' configs share; a file that names its own
    keeps it (the caller refuses a mismatch)."""
    if is_gguf(path):  # its metadata; a file gguf-py cannot read is a bad file whoever named it
        return gguf_config(metadata(path), where=f"{flag} {path}")
    data = read_json(path, flag) if own else read_config_json(path, flag=flag, what=CONFIG_WHAT)
    try:
        if arch is not None and hf_arch(data) is None:
            return arch_named(arch).config_from_book(data)
        return config_from_dict(data)
    except ConfigError as exc:
        raise type(exc)(f"{flag} {path}: {exc}") from None


def gguf_config(fields: dict[str, Any], *, where: str) -> DecoderConfig:
    """The config of a GGUF file from its metadata (gguf/read.py's read_metadata): general.architecture names the
    architecture, which reads its own keys."""
    name = fields.get("general.architecture")
    try:
        if not isinstance(name, str):
            raise ConfigError(f"no general.architecture in its metadata (got {name!r})")
        return by_gguf_arch(name).config_from_gguf(fields)
    except ConfigError as exc:
        raise type(exc)(f"{where}: {exc}") from None


def gguf_origin(path: Path, cfg: DecoderConfig) -> Origin:
    """A GGUF's generation facts: its eos (and end-of-turn) and bos ids (tokenizer.ggml.*), which the folder's
    config.json and generation_config.json say as the file does; the architecture's other carried fields as its
    hf_config writes them."""
    eos_ids, bos = gguf_ids(metadata(path), cfg.vocab_size)
    arch = arch_of(cfg)
    ids = {"bos_token_id": bos, "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else list(eos_ids) or None}
    ids = {k: v for k, v in ids.items() if v is not None}
    fields = arch.hf_config(cfg, tied=False, eos_id=eos_ids[0] if eos_ids else None)
    carried = {k: fields[k] for k in arch.HF_CARRIED if k in fields} | {k: v for k, v in ids.items()
                                                                        if k in arch.HF_CARRIED}
    return Origin(eos_ids=eos_ids, bos_id=bos, carried=carried, generation=ids)


def read_json(path: Path, flag: str) -> dict[str, Any]:
    """A checkpoint's JSON file: whatever is wrong in it (not JSON, a duplicate key) is a bad file, exit 1, as the
    user did not name it."""
    try:
        return read_config_json(path, flag=flag, what="a JSON object")
    except ConfigError as exc:  # BadValueError (a duplicate key) too: the file is bad, no value was given
        raise ConfigError(str(exc)) from None


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
