"""`mha generate DIR`: stream tokens from a decoder folder; end with one line of counts and timings (or --json)."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import click

from mha_runtime.artifact.errors import ContractError, cut
from mha_runtime.cli.options import THREADS

# A token id as the Node and C runners read it: ASCII digits with an optional sign. int() alone also reads any
# script's digits ('\u0663' is 3) and underscores ('1_0' is 10).
_ID = re.compile(r"[-+]?[0-9]+")


def parse_ids(text: str) -> list[int]:
    """'1,2,3' -> [1, 2, 3]; anything else is one line naming the bad piece."""
    pieces = [p.strip() for p in text.split(",")]
    if not text.strip():
        raise ContractError("--prompt-ids: expected comma-separated token ids, got an empty prompt")
    ids = []
    for piece in pieces:
        try:
            if not _ID.fullmatch(piece):
                raise ValueError(piece)
            ids.append(int(piece, 10))
        except ValueError:  # also an integer past sys.get_int_max_str_digits() digits; quoted cut, as Node does
            raise ContractError(f"--prompt-ids: expected comma-separated integers, got {cut(piece, 30)!r}") from None
    return ids


def check_form(form: str | None) -> None:
    """--form names one of a GPT folder's decoder files: a path (`../x/gpt.onnx`, `/abs/gpt.onnx`) or '' is a bad
    value, exit 2, before the folder is read. A decoder name the folder does not hold stays the folder's line."""
    from mha_runtime.decoder.contract import PTE_FORM
    from mha_runtime.decoder.forms import FORMS

    names = [*FORMS, PTE_FORM]
    if form is not None and form not in names:
        raise click.BadParameter(f"expected a decoder file name of the folder, one of {', '.join(names)}; got "
                                 f"{cut(form, 60)!r}", param_hint="'--form'")


@click.command("generate")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--prompt", "prompts", multiple=True,
              help="Prompt text (needs the folder's tokenizer); repeat for a batch.")
@click.option("--prompt-ids", "prompt_ids", multiple=True, help="Comma-separated token ids; repeat for a batch.")
@click.option("--chat", default=None, help="A user message, rendered with the folder's chat template (as transformers' "
              "apply_chat_template); the reply is printed, ending at the template's end of turn.")
@click.option("--max-new-tokens", type=int, default=32, show_default=True)
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0: greedy.")
@click.option("--top-k", type=int, default=None, help="Keep the k most likely tokens before sampling.")
@click.option("--seed", type=int, default=None, help="Seed of the sampling draws (the same seed, the same tokens).")
@click.option("--eos/--no-eos", default=True, show_default=True,
              help="Stop a row at the model's end-of-text ids (the manifest's eos_ids) when it has them.")
@click.option("--form", default=None, help="Decoder file to run [default: the fastest, gpt.inplace.onnx]; "
              "gpt.pte runs through ExecuTorch (batch 1; needs the export package with its executorch extra).")
@click.option("--threads", type=THREADS, default=None,
              help="ONNX Runtime intra-op threads (for gpt.pte: ExecuTorch's thread pool).")
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the stream.")
def generate_cmd(artifact_dir: Path, prompts: tuple[str, ...], prompt_ids: tuple[str, ...], chat: str | None,
                 max_new_tokens: int, temperature: float, top_k: int | None, seed: int | None, eos: bool,
                 form: str | None, threads: int | None, provider: str, as_json: bool) -> None:
    """Generate tokens from a decoder folder (greedy or sampled), streamed as text or ids."""
    from mha_runtime.decoder.chat.folder import folder_chat, user_message
    from mha_runtime.decoder.tokenizer import TextStream
    from mha_runtime.kinds import kind_of

    if chat is not None and (prompts or prompt_ids):
        raise click.UsageError("give --chat TEXT or a prompt (--prompt, --prompt-ids), not both: the chat's message is "
                               "its prompt")
    if chat is None and bool(prompts) == bool(prompt_ids):
        raise click.UsageError("give the prompt as --prompt TEXT or as --prompt-ids 1,2,3 (one of the two)")
    check_form(form)
    kind = kind_of(artifact_dir)  # the kind's generator, or its one line naming what the kind offers
    gen = kind.needs(kind.generator, "generate", artifact_dir)(artifact_dir, form=form, provider=provider,
                                                               threads=threads)
    eos_id = gen.manifest.stop_ids if eos else None  # every eos id of the folder
    try:  # a bad prompt or setting is a bad value: exit 2, as click's own checks, before anything is printed
        if chat is not None:  # the template's text; the reply ends at its end of turn too (chat/folder.py)
            talk = folder_chat(artifact_dir, gen.manifest, gen.tokenizer)
            batch, eos_id = [talk.encode(user_message(chat), "--chat")], talk.stop_ids if eos else None
        else:
            batch = [gen.encode(p) for p in prompts] if prompts else [parse_ids(t) for t in prompt_ids]
        gen.check(batch, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, eos_id=eos_id,
                  seed=seed)
    except ContractError as exc:
        raise click.UsageError(str(exc)) from None
    kwargs = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, seed=seed, eos_id=eos_id)
    if as_json:
        result = gen.generate(batch, **kwargs)  # type: ignore[arg-type]
        click.echo(json.dumps({"prompt_ids": result.prompt_ids, "ids": result.ids,
                               "time_to_first_token_s": round(result.time_to_first_token_s, 6),
                               "tokens_per_s": round(result.tokens_per_s, 3), "stops": result.stops,
                               "seed": result.seed}))
        return
    stream: TextStream | None = None
    if gen.tokenizer is not None and len(batch) == 1:  # one row with a tokenizer streams text, else ids
        stream = TextStream(gen.tokenizer)
        if chat is None:  # a chat prints its reply alone, not the template's text
            click.echo(gen.tokenizer.decode(batch[0]), nl=False)

    def show(new: list[int | None]) -> None:
        if len(batch) == 1 and new[0] is not None:  # a batch is shown once done
            sys.stdout.write(f"{new[0]} " if stream is None else stream.push(new[0]))
            sys.stdout.flush()

    result = gen.generate(batch, on_step=show, **kwargs)  # type: ignore[arg-type]
    if len(batch) > 1:  # rows would interleave: each row's new text (or ids) once all are done
        for i, row in enumerate(result.ids):
            shown = gen.tokenizer.decode(row) if gen.tokenizer is not None and prompts else ",".join(map(str, row))
            click.echo(f"[{i}] {shown}")
    else:
        click.echo("" if stream is None else stream.end())
    sys.stdout.flush()  # the text ends before the summary line on a terminal that shows both streams
    stops = ", ".join(sorted(set(result.stops)))
    click.echo(f"{result.tokens} tokens, time to first token {result.time_to_first_token_s * 1e3:.1f} ms, "
               f"{result.tokens_per_s:.1f} tokens/s (stopped: {stops}"
               + ("; greedy)" if temperature == 0 else f"; seed {result.seed})"), err=True)  # greedy draws nothing
