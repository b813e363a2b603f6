"""A decoder folder's chat: its template, its named special tokens and the ids a reply ends at.

The template is what transformers' AutoTokenizer.from_pretrained(folder) takes: chat_template.jinja when the manifest
lists one (save_pretrained writes it there since transformers 4.43, and it wins over the config), else
tokenizer_config.json's "chat_template" (a string, or a list of {name, template} of which "default" is taken, as
transformers and transformers.js take it). The named special tokens come from tokenizer_config.json alone: a
tokenizer class's own defaults for tokens the file leaves out are not applied.

A reply ends at the first of the end-of-turn ids the export recorded (contract.chat.end_of_turn_ids; how they are
found: chat/turns.py). A folder exported before that field, whose template has no recorded end of turn, is refused
for a chat in one line (re-export it): it still generates from a prompt.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mha_runtime.artifact.errors import ArtifactError, ContractError, first_line
from mha_runtime.artifact.manifest import read_verified
from mha_runtime.decoder.chat.template import Message, check_messages, named_tokens, render
from mha_runtime.decoder.contract import END_OF_TURN, TOKENIZER_CONFIG, read_end_of_turn
from mha_runtime.decoder.manifest import GPTManifest
from mha_runtime.decoder.tokenizer import GPTTokenizer

CHAT_TEMPLATE_FILE = "chat_template.jinja"


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
        add_special_tokens=False: the template writes the ones it wants, a post-processor's BOS would be a second)."""
        try:
            return self.tokenizer.encode(self.render(messages, where), specials=False)
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
    return listed_template(config, str(folder / TOKENIZER_CONFIG)), config


def listed_template(config: dict[str, Any], where: str) -> str | None:
    """tokenizer_config.json's "chat_template": a string, or the "default" of a list of {name, template}; None."""
    listed = config.get("chat_template")
    if isinstance(listed, list):  # several named templates: the default one
        listed = next((t.get("template") for t in listed if isinstance(t, dict) and t.get("name") == "default"), None)
    if listed is not None and not isinstance(listed, str):
        raise ArtifactError(f"{where}: 'chat_template': expected a string or a list of {{name, template}} with a "
                            f"'default', got {type(listed).__name__}")
    return listed


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
    stops = read_end_of_turn(manifest.contract, manifest.shapes.vocab_size, str(folder / "manifest.json"))
    if stops is None:
        raise ArtifactError(f"{folder}: the manifest records no end-of-turn ids (contract.chat.{END_OF_TURN}: the "
                            "folder was exported before it); re-export it to chat with it, or give a prompt")
    return FolderChat(template=source, tokens=named_tokens(config), stop_ids=stops, tokenizer=tokenizer)


def user_message(text: str) -> list[Message]:
    """`--chat TEXT` as a conversation: one user message."""
    return [{"role": "user", "content": text}]
