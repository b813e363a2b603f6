"""A decoder folder's chat: its template, its named special tokens and the ids a reply ends at.

The template is what transformers' AutoTokenizer.from_pretrained(folder) takes: chat_template.jinja when the manifest
lists one (save_pretrained writes it there since transformers 4.43, and it wins over the config), else
tokenizer_config.json's "chat_template" (a string, or a list of {name, template} of which "default" is taken, as
transformers and transformers.js take it). The named special tokens come from tokenizer_config.json alone: a
tokenizer class's own defaults for tokens the file leaves out are not applied.

A reply ends at the first of (stop_ids, in this order): the folder's eos ids (manifest eos_ids: what
transformers' generate stops at), the id of tokenizer_config.json's eos_token (a chat model's end of turn:
Llama 3's <|eot_id|>, Qwen's <|im_end|>), and for a ChatML template (one that writes <|im_end|>) the id of
<|im_end|>. A token counts only where the folder's tokenizer encodes its text as exactly one id.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mha_runtime.artifact.errors import ArtifactError, ContractError, first_line
from mha_runtime.artifact.manifest import read_verified
from mha_runtime.decoder.chat.template import Message, check_messages, named_tokens, render
from mha_runtime.decoder.contract import TOKENIZER_CONFIG
from mha_runtime.decoder.manifest import GPTManifest
from mha_runtime.decoder.tokenizer import GPTTokenizer

CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHATML_END = "<|im_end|>"


@dataclass(frozen=True)
class FolderChat:
    """What a chat on the folder needs: the template's source, the named special tokens, the stop ids."""

    template: str
    tokens: dict[str, str]
    stop_ids: tuple[int, ...]
    tokenizer: GPTTokenizer

    def render(self, messages: object, where: str = "messages") -> str:
        """The messages as apply_chat_template(..., add_generation_prompt=True, tokenize=False) renders them."""
        return render(self.template, check_messages(messages, where), self.tokens)

    def encode(self, messages: object, where: str = "messages") -> list[int]:
        """The rendered text's ids, no special tokens added (apply_chat_template(tokenize=True) encodes with
        add_special_tokens=False: the template writes the ones it wants)."""
        try:
            return self.tokenizer.encode(self.render(messages, where))
        except ContractError as exc:  # text that is not Unicode (a lone surrogate), named by where it came from
            raise ContractError(str(exc).replace("prompt: ", f"{where}: ", 1)) from None


def template_source(folder: Path, manifest: GPTManifest) -> tuple[str | None, dict[str, Any]]:
    """(the folder's chat template or None, its tokenizer_config.json as an object or {}), each file verified."""
    config: dict[str, Any] = {}
    if TOKENIZER_CONFIG in manifest.files:
        where = folder / TOKENIZER_CONFIG
        try:
            loaded = json.loads(read_verified(folder, TOKENIZER_CONFIG, manifest))
        except (ValueError, RecursionError) as exc:
            raise ArtifactError(f"{where}: expected JSON ({first_line(exc)})") from None
        if not isinstance(loaded, dict):
            raise ArtifactError(f"{where}: expected a JSON object")
        config = loaded
    if CHAT_TEMPLATE_FILE in manifest.files:
        try:
            return read_verified(folder, CHAT_TEMPLATE_FILE, manifest).decode("utf-8"), config
        except UnicodeDecodeError:
            raise ArtifactError(f"{folder / CHAT_TEMPLATE_FILE}: expected UTF-8 text") from None
    listed = config.get("chat_template")
    if isinstance(listed, list):  # several named templates: the default one
        listed = next((t.get("template") for t in listed if isinstance(t, dict) and t.get("name") == "default"), None)
    if listed is not None and not isinstance(listed, str):
        raise ArtifactError(f"{folder / TOKENIZER_CONFIG}: 'chat_template': expected a string or a list of "
                            f"{{name, template}} with a 'default', got {type(listed).__name__}")
    return listed, config


def single_id(tokenizer: GPTTokenizer, text: str) -> int | None:
    """The id of `text` when the tokenizer encodes it as one token, else None."""
    ids = tokenizer.encode(text)
    return ids[0] if len(ids) == 1 else None


def folder_chat(folder: Path, manifest: GPTManifest, tokenizer: GPTTokenizer | None) -> FolderChat:
    """The folder's chat, or one ContractError line saying it has no template (or no tokenizer to encode it)."""
    folder = Path(folder)
    source, config = template_source(folder, manifest)
    if source is None:
        raise ContractError(f"{folder}: this folder has no chat template (no chat_template in its "
                            f"{TOKENIZER_CONFIG}, no {CHAT_TEMPLATE_FILE}); give a prompt instead")
    if tokenizer is None:
        raise ContractError(f"{folder}: this folder has a chat template but no tokenizer (exported without "
                            "--tokenizer); a chat needs one")
    tokens = named_tokens(config)
    ends = [tokens.get("eos_token")] + ([CHATML_END] if CHATML_END in source else [])
    extra = [single_id(tokenizer, t) for t in ends if t]
    stops = tuple(dict.fromkeys([*manifest.stop_ids, *(i for i in extra if i is not None)]))
    return FolderChat(template=source, tokens=tokens, stop_ids=stops, tokenizer=tokenizer)


def user_message(text: str) -> list[Message]:
    """`--chat TEXT` as a conversation: one user message."""
    return [{"role": "user", "content": text}]
