"""What `mha serve` checks and ships for a GPT folder, before Ray starts: the files, the limits, /v1/contract."""
from __future__ import annotations

from typing import Any

from mha_runtime.artifact.errors import MHAError, ServeError, first_line
from mha_runtime.artifact.manifest import DECODER_KIND, MANIFEST_NAME, read_verified
from mha_runtime.decoder.chat.folder import CHAT_TEMPLATE_FILE, folder_chat, template_source
from mha_runtime.decoder.contract import TOKENIZER_CONFIG, TOKENIZER_FILE
from mha_runtime.decoder.forms import FASTEST, FORMS
from mha_runtime.decoder.generate import MAX_BATCH, Generator
from mha_runtime.decoder.shapes import cache_bytes
from mha_runtime.serve.decoder.wire import DEFAULT_MAX_NEW_TOKENS, GENERATE, REQUEST_KEYS, generate_body_limit
from mha_runtime.serve.options import ServeOptions

# A replica preallocates the whole cache of every slot; more than this per replica is refused before Ray starts.
MAX_CACHE_BYTES = 4 << 30


def prepare_gpt(options: ServeOptions) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Load the folder (every file it uses verified), refuse what cannot be served, generate one token here."""
    folder, max_batch = options.artifact, options.max_batch
    form = FASTEST if options.model is None else options.model  # '' is refused, as `mha generate --form ''`
    if form in FORMS and FORMS[form].kind != "inplace":
        raise ServeError(f"--model {form}: serving batches generations over the in-place cache; choose "
                         f"{' or '.join(f for f, spec in FORMS.items() if spec.kind == 'inplace')}")
    if max_batch > MAX_BATCH:
        raise ServeError(f"--max-batch {max_batch}: a GPT replica holds at most {MAX_BATCH} generations at once")
    gen = Generator(folder, form=form, provider=options.provider, threads=options.threads)
    need = cache_bytes(gen.shapes, max_batch)
    if need > MAX_CACHE_BYTES:
        raise ServeError(f"--max-batch {max_batch}: the cache of {max_batch} slots of {gen.shapes.context_length} "
                         f"tokens is {need / 2**30:.1f} GiB per replica, over the limit of "
                         f"{MAX_CACHE_BYTES / 2**30:.0f} GiB; lower --max-batch")
    try:
        gen.generate([[0]], max_new_tokens=1)
    except MHAError:
        raise
    except Exception as exc:
        raise ServeError(f"{folder / form}: cannot serve it ({first_line(exc)})") from None
    m = gen.manifest
    # A chat template with a tokenizer to encode it: messages are taken (its files shipped, read there again).
    chat = m.tokenizer is not None and template_source(folder, m)[0] is not None
    if chat:  # a folder exported before its end-of-turn ids were recorded: its one line here, before Ray starts
        folder_chat(folder, m, gen.tokenizer)
    files = {MANIFEST_NAME: (folder / MANIFEST_NAME).read_bytes()}
    chat_files = [f for f in (TOKENIZER_CONFIG, CHAT_TEMPLATE_FILE) if chat and f in m.files]
    for name in [form] + ([TOKENIZER_FILE] if m.tokenizer is not None else []) + chat_files:
        files[name] = read_verified(folder, name, m)
    info = {"name": m.name, "kind": DECODER_KIND, "model": form, "sha256": m.files[form].sha256,
            "config": m.config, "contract": m.contract | {"shapes": gen.shapes.to_dict()},  # a legacy folder's too
            "tolerance": FORMS[form].tolerance.to_dict(),
            "eos_id": m.eos_id, "eos_ids": list(m.stop_ids), "tokenizer": m.tokenizer is not None, "chat": chat,
            "max_batch": max_batch,
            "body_limit_bytes": generate_body_limit(gen.shapes),
            "generate": {"route": GENERATE, "keys": list(REQUEST_KEYS),
                         "default_max_new_tokens": DEFAULT_MAX_NEW_TOKENS}}
    return files, info
