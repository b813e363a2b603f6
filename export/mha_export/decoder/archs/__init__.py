"""The decoder architectures, one module each (the protocol: archs/protocol.py), and how each is found: by name
(a config's `arch`), by a Hugging Face config.json's `model_type`, by a GGUF's `general.architecture`, or by the
keys of the book's config dict.

A row is the architecture's module itself: `ARCHS["gpt2"]` is mha_export.decoder.archs.gpt2, which an editor, a
type checker and the import graph follow. A new architecture is a module and one row here.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from mha_export.decoder.archs import gemma3, gpt2, llama, qwen3
from mha_export.decoder.archs.protocol import Architecture, DecoderConfig
from mha_runtime.artifact.errors import BadValueError

ARCHS: Mapping[str, Architecture] = MappingProxyType({
    gpt2.NAME: gpt2,
    llama.NAME: llama,
    qwen3.NAME: qwen3,
    gemma3.NAME: gemma3,
})


def _unknown(what: str, value: object) -> BadValueError:
    """One line naming what was asked for and the architectures there are."""
    supported = ", ".join(f"{a.NAME} ({what} {_said(a, what)!r})" for a in ARCHS.values())
    return BadValueError(f"unknown architecture: {what} {value!r}; supported: {supported}")


def _said(arch: Architecture, what: str) -> str:
    return {"model_type": arch.HF_MODEL_TYPE, "general.architecture": arch.GGUF_ARCH}.get(what, arch.NAME)


def arch_named(name: str) -> Architecture:
    """The architecture called `name` (a config's `arch`, contract.shapes' `arch`)."""
    try:
        return ARCHS[name]
    except (KeyError, TypeError):
        raise _unknown("arch", name) from None


def arch_of(config: DecoderConfig) -> Architecture:
    """The architecture of a config (its `arch`)."""
    return arch_named(config.arch)


def by_model_type(model_type: str) -> Architecture:
    """The architecture of a Hugging Face config.json's `model_type`."""
    found = next((a for a in ARCHS.values() if a.HF_MODEL_TYPE == model_type), None)
    if found is None:
        raise _unknown("model_type", model_type)
    return found


def by_gguf_arch(name: str) -> Architecture:
    """The architecture of a GGUF file's `general.architecture`."""
    found = next((a for a in ARCHS.values() if a.GGUF_ARCH == name), None)
    if found is None:
        raise _unknown("general.architecture", name)
    return found


def hf_arch(doc: dict[str, Any]) -> Architecture | None:
    """The architecture of a Hugging Face config.json (by `model_type`, or by a key only one family's has where a
    file names no model_type), or None for a dict of the book's keys."""
    if "model_type" in doc:
        return by_model_type(doc["model_type"])
    return next((a for a in ARCHS.values() if a.HF_CONFIG_KEY in doc), None)


def book_arch(doc: dict[str, Any]) -> Architecture:
    """The architecture of the book's config dict, by its keys: the family whose keys hold them all, the one with
    the fewest where several do (the book's GPT config's five shape keys are a subset of every family's). Where
    none holds them all, the one that holds the most, whose reader then names the key it does not know."""
    keys = set(doc)
    holding = [a for a in ARCHS.values() if keys <= a.BOOK_KEYS]
    if holding:
        return min(holding, key=lambda a: len(a.BOOK_KEYS))
    return max(ARCHS.values(), key=lambda a: len(keys & a.BOOK_KEYS))


def config_from_dict(doc: dict[str, Any]) -> DecoderConfig:
    """A decoder config from a JSON object: a Hugging Face config.json or the book's config dict."""
    hf = hf_arch(doc)
    return hf.config_from_hf(doc) if hf is not None else book_arch(doc).config_from_book(doc)
