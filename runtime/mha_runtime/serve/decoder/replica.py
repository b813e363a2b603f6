"""The GPT's model in a replica (serve/deployment.py): one in-place decoder and its BatchEngine."""
from __future__ import annotations

from typing import Any

from mha_runtime.decoder.chat.folder import folder_chat
from mha_runtime.decoder.decoder import InPlaceDecoder
from mha_runtime.decoder.generate import Generator
from mha_runtime.serve.decoder.engine import BatchEngine
from mha_runtime.serve.decoder.service import GenerateService
from mha_runtime.serve.options import ServeOptions
from mha_runtime.serve.replica import shipped_folder


class GenerateReplica:
    """The decoder, the engine that steps every generation in flight, and the GPT's service."""

    def __init__(self, files: dict[str, bytes], options: ServeOptions, info: dict[str, Any]) -> None:
        # Every sha256 is checked again here; the session and tokenizer keep their bytes, so the folder can go.
        with shipped_folder(files) as folder:
            gen = Generator(folder, form=info["model"], provider=options.provider, threads=options.threads)
            chat = folder_chat(folder, gen.manifest, gen.tokenizer) if info.get("chat") else None
        decoder = gen.decoder()
        assert isinstance(decoder, InPlaceDecoder)  # prepare_gpt refused the other form
        self.engine = BatchEngine(decoder, max_batch=options.max_batch, eos_id=gen.manifest.stop_ids,
                                  tokenizer=gen.tokenizer)
        encode = gen.tokenizer.encode if gen.tokenizer is not None else None
        self.service = GenerateService(shapes=gen.shapes, info=info, engine=self.engine, encode=encode, chat=chat)

    def close(self) -> None:
        self.engine.closed = True
