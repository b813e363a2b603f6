"""Generation in the torch-free runtime: prefill, step, sample, stream; a batch of prompts of any lengths.

A row stops at max_new_tokens, at any of the eos ids (the id itself is not returned, as in the book's `generate`), or
when its sequence reaches context_length: the model has no position for a further token, and a window that
slides silently would no longer be the prompt the user gave. Every stop is named in the result.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from mha_runtime.artifact.config_fields import check_own_config
from mha_runtime.artifact.errors import ArtifactError, ContractError
from mha_runtime.artifact.manifest import read_verified
from mha_runtime.decoder.contract import PTE_FORM, TOKENIZER_FILE, id_problem
from mha_runtime.decoder.decoder import Decoder, check_signature, decoder_for, make_session, own_config
from mha_runtime.decoder.forms import FASTEST, FORMS, PTE
from mha_runtime.decoder.manifest import GPTManifest, load_gpt_manifest
from mha_runtime.decoder.sampling import Sampler, check_sampling
from mha_runtime.decoder.shapes import DecoderShapes
from mha_runtime.decoder.tokenizer import GPTTokenizer
from mha_runtime.executorch.decoder import PteProgram, check_bounds, check_request, pte_program

MAX_BATCH = 64
# The ids a generation stops at: one id, several (a folder's manifest.stop_ids), or none.
EosIds = int | Collection[int] | None


def stop_set(eos: EosIds) -> frozenset[int]:
    """`eos` as the set of ids take_token stops at."""
    return frozenset() if eos is None else frozenset([eos] if isinstance(eos, int) else eos)


@dataclass
class Generation:
    """What one generate call produced: per row the new ids and why it stopped; and its timings."""

    prompt_ids: list[list[int]]
    ids: list[list[int]] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)  # max_new_tokens | eos | context_length
    seed: int = 0
    time_to_first_token_s: float = 0.0
    seconds: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(len(r) for r in self.ids)

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second after the first one (decode speed; the first token is the prefill's)."""
        rest = self.seconds - self.time_to_first_token_s
        later = self.tokens - sum(1 for r in self.ids if r)
        return later / rest if rest > 0 and later > 0 else 0.0


def check_prompts(prompts: list[list[int]], shapes: DecoderShapes) -> None:
    """One line for the first bad prompt: empty, not integers, an id outside the vocabulary, too long. The rule is
    `mha inspect`'s and every runner's, 1 <= prompt + new tokens <= context_length: a prompt leaves room for one new
    token (one of context_length tokens got one at position context_length + 1; serve, the C and Node runners
    refuse it in the same words)."""
    if not isinstance(prompts, list) or not prompts:
        raise ContractError("prompt: expected at least one prompt of token ids, got none")
    if len(prompts) > MAX_BATCH:
        raise ContractError(f"prompt: expected at most {MAX_BATCH} prompts in one batch, got {len(prompts)}")
    for row, prompt in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt {row}"
        if not isinstance(prompt, list) or not prompt:
            raise ContractError(f"{where}: expected at least one token id, got an empty prompt")
        problem = id_problem(prompt, shapes.vocab_size, repr)
        if problem is not None:
            raise ContractError(f"{where}: {problem}")
        if len(prompt) > shapes.context_length:
            raise ContractError(f"{where}: {len(prompt)} tokens, longer than context_length {shapes.context_length}")
        if len(prompt) == shapes.context_length:
            raise ContractError(f"{where}: {len(prompt)} tokens fill context_length {shapes.context_length}, leaving "
                                f"no room for a new token; give at most {shapes.context_length - 1}")


def take_token(ids: list[int], token: int, *, prompt_tokens: int, max_new_tokens: int, eos_id: EosIds,
               context_length: int) -> str:
    """Append a row's next token to its new ids, unless it is an eos id; return why the row stops now ('' if
    not)."""
    if token in stop_set(eos_id):
        return "eos"
    ids.append(token)
    if len(ids) >= max_new_tokens:
        return "max_new_tokens"
    if prompt_tokens + len(ids) >= context_length:
        return "context_length"
    return ""


class Generator:
    """Generate from a decoder folder made by `mha export --gpt`: its manifest and files are verified first; every
    shape is the manifest's contract.shapes (`shapes`)."""

    def __init__(self, folder: str | Path, *, form: str | None = None, provider: str = "cpu",
                 threads: int | None = None) -> None:
        self.folder = Path(folder)
        self.manifest: GPTManifest = load_gpt_manifest(self.folder)
        self.shapes = self.manifest.shapes
        listed = [f for f in [*FORMS, PTE_FORM] if f in self.manifest.artifacts]
        self.form = form if form is not None else (FASTEST if FASTEST in listed else (listed[0] if listed else ""))
        if self.form not in listed:
            raise ArtifactError(f"{self.folder}: no decoder {form or ''} listed in the manifest; it holds "
                                f"{', '.join(listed) or 'none'}")
        where = self.folder / self.form
        self.kind = PTE.kind if self.form == PTE_FORM else FORMS[self.form].kind
        self.pte: PteProgram | None = None
        if self.kind == PTE.kind:  # ExecuTorch, through the export package's registered runner
            if provider != "cpu":
                raise ContractError(f"{where}: runs on the CPU (XNNPACK); --provider {provider} is for the ONNX forms")
            self.bounds = check_bounds(self.manifest.artifacts[self.form].bounds or {}, self.shapes, str(where))
            self.pte = pte_program(read_verified(self.folder, self.form, self.manifest), self.manifest.config,
                                   self.shapes, self.bounds, where=str(where), threads=threads)
        else:
            self.session = make_session(read_verified(self.folder, self.form, self.manifest), provider=provider,
                                        threads=threads, where=str(where))
            check_own_config(self.manifest.config, own_config(self.session), str(where))
            check_signature(self.session, self.kind, self.shapes, str(where))
        self.tokenizer: GPTTokenizer | None = None
        if self.manifest.tokenizer is not None:
            data = read_verified(self.folder, TOKENIZER_FILE, self.manifest)
            self.tokenizer = GPTTokenizer(data, vocab_size=self.shapes.vocab_size,
                                          where=str(self.folder / TOKENIZER_FILE))

    def decoder(self) -> Decoder:
        if self.pte is not None:
            return self.pte.decoder()  # type: ignore[no-any-return]
        return decoder_for(self.kind, self.session, self.shapes, self.folder / self.form)

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ContractError(f"{self.folder}: this folder has no tokenizer (exported without --tokenizer); "
                                "give token ids (--prompt-ids)")
        return self.tokenizer.encode(text)

    def check(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 0.0,
              top_k: int | None = None, eos_id: EosIds = None, seed: int | None = None) -> None:
        """Refuse a request in one line before anything runs."""
        check_prompts(prompts, self.shapes)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ContractError(f"seed: expected an integer >= 0, got {seed!r}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ContractError(f"max_new_tokens: expected an integer >= 1, got {max_new_tokens!r}")
        if self.pte is not None:  # gpt.pte's bounds, before ExecuTorch loads the program
            check_request(prompts, max_new_tokens, self.bounds)
        check_sampling(temperature, top_k, self.shapes.vocab_size)
        bad = [i for i in stop_set(eos_id) if isinstance(i, bool) or not isinstance(i, int)
               or not 0 <= i < self.shapes.vocab_size]
        if bad:
            raise ContractError(f"eos_id: expected token ids below {self.shapes.vocab_size}, got {bad[0]!r}")
        if self.pte is not None:  # loaded only for a request it can take, and outside the timings
            self.pte.load()

    def generate(self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, seed: int | None = None, eos_id: EosIds = None,
                 on_step: Callable[[list[int | None]], None] | None = None) -> Generation:
        """Generate; after each step, on_step gets every row's new id (None for a row that has stopped). Checks
        come first."""
        self.check(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, eos_id=eos_id,
                   seed=seed)
        sampler = Sampler(len(prompts), temperature=temperature, top_k=top_k, seed=seed,
                          vocab_size=self.shapes.vocab_size)
        out = Generation(prompt_ids=[list(p) for p in prompts], ids=[[] for _ in prompts],
                         stops=["" for _ in prompts], seed=sampler.seed)
        start = time.perf_counter()
        decoder = self.decoder()
        logits = decoder.prefill(out.prompt_ids)
        context = self.shapes.context_length
        while True:
            live = [r for r, s in enumerate(out.stops) if not s]
            chosen = sampler.next_ids(logits[live], live)
            new: list[int | None] = [None] * len(prompts)
            for r, token in zip(live, chosen, strict=True):
                out.stops[r] = take_token(out.ids[r], token, prompt_tokens=len(prompts[r]),
                                          max_new_tokens=max_new_tokens, eos_id=eos_id, context_length=context)
                if out.stops[r] != "eos":
                    new[r] = token
            if not out.time_to_first_token_s:
                out.time_to_first_token_s = time.perf_counter() - start
            out.seconds = time.perf_counter() - start
            if on_step is not None:
                on_step(new)
            if all(out.stops):
                return out
            # Every row is fed its last token; a stopped row's is ignored and does not advance its cache (it
            # stopped with room for one more: prompt + new <= context_length, the last new one never fed).
            feed = [(r[-1] if r else p[-1]) for r, p in zip(out.ids, out.prompt_ids, strict=True)]
            logits = decoder.step(feed, [not s for s in out.stops])
