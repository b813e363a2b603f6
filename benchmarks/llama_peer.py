"""llama.cpp beside our ONNX forms on the same weights: a GPT folder of ours -> a Hugging Face GPT-2 folder -> GGUF
(F32, Q8_0, Q4_0) -> llama-bench's speeds and llama-perplexity's KL divergence from F32.

The binaries come from `make llama-tools` (tools/llama_cpp.sh --tools: the llama.cpp tree bundled in the pinned
llama-cpp-python 0.3.36 source release, built into .cache/llama.cpp/); `llama_bin` is None until then.

What `llama-perplexity --kl-divergence -c CTX --chunks N` scores (tools/perplexity/perplexity.cpp of that tree):

- The text file is read whole, one trailing "\\n" dropped, and tokenized once with `add_special=true,
  parse_special=false`: "<|endoftext|>" in the text is plain text (<, |, endoftext, |, >), never id 50256.
- A BOS id is put first only where the GGUF's vocabulary says add_bos. A GPT-2 GGUF from the converter does not:
  the "gpt-2" pre-tokenizer defaults to add_bos false and the folder written here has no tokenizer_config.json to
  set it. (Where add_bos holds, BOS is prepended to the whole text AND overwrites the first token of every chunk.)
- Chunk i is tokens[i*CTX:(i+1)*CTX], non-overlapping, from the start; N = min(--chunks, len // CTX), and fewer
  than 2*CTX tokens is refused. Each chunk runs from an empty cache at positions 0..CTX-1.
- Scored: the logits at positions CTX/2 .. CTX-2 of each chunk, each against the next token, so tokens
  CTX/2+1 .. CTX-1 are predicted: CTX-1-CTX/2 positions per chunk (63 of 128). The base pass
  (`--kl-divergence-base FILE` without --kl-divergence) writes the chunks' tokens and those positions'
  log-probabilities (uint16-quantized, values below -16 ignored in the KL sum); the quant pass reads the tokens
  from FILE (not the text) and prints mean KL, percentiles, max, same top token and both perplexities.

`quality.measure` over the same windows (`llama_windows`) prefills the first CTX/2 tokens and scores CTX/2
positions, predicting tokens CTX/2 .. CTX-1: llama.cpp's 63 positions and one more (token CTX/2, predicted from
position CTX/2-1). So the two share every window and all but one position of each.
"""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

from benchmarks.gpt_peers import book_state, hf_model
from mha_export.decoder.archs import arch_named
from mha_runtime.decoder.manifest import load_gpt_manifest

ROOT = Path(__file__).resolve().parents[1]
LLAMA_DIR = ROOT / ".cache" / "llama.cpp"  # tools/llama_cpp.sh builds here
BIN_DIR = LLAMA_DIR / "build" / "bin"
CONVERTER = LLAMA_DIR / "src" / "convert_hf_to_gguf.py"
# The build's only version mark: the tree has no git history, so llama-bench's build_commit reads "unknown".
SOURCE = "llama-cpp-python==0.3.36 (vendor/llama.cpp)"
# Q8_0 and Q4_0 are both made by llama-quantize from the F32 GGUF: llama.cpp's README workflow (convert, then
# quantize), and one tensor-type policy for both quants.
QUANTS = ("Q8_0", "Q4_0")
LOGITS_MAGIC = b"_logits_"


def llama_bin(name: str) -> Path | None:
    """The built llama.cpp binary `name` (e.g. "llama-bench"), or None before `make llama-tools`."""
    path = BIN_DIR / name
    return path if path.is_file() else None


def _need(name: str) -> Path:
    path = llama_bin(name)
    if path is None:
        raise FileNotFoundError(f"{BIN_DIR / name}: not built; run `make llama-tools`")
    return path


def _run(cmd: list[str | Path]) -> subprocess.CompletedProcess[str]:
    """Run a llama.cpp command to its end; RuntimeError with the tail of its output if it fails."""
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace",
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    return done


# -- weights -------------------------------------------------------------------------------------------------------

def write_hf_folder(folder_of_ours: Path, out: Path, vocab_dir: Path) -> Path:
    """A Hugging Face GPT-2 folder of a GPT folder's weights, in the shape llama.cpp's converter takes."""
    manifest = load_gpt_manifest(Path(folder_of_ours))  # checks the files' sha256 too
    cfg = arch_named(manifest.shapes.arch).config_from_book(manifest.config)
    out = Path(out)
    model = hf_model(book_state(Path(folder_of_ours)), cfg)
    if manifest.weights.get("tied"):  # GPT-2's own layout: the head is the embedding, stored once (the GGUF too)
        model.config.tie_word_embeddings = True
        model.tie_weights()
    model.save_pretrained(out)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config["n_ctx"] = cfg.context_length  # the converter reads it; transformers no longer writes it
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    # GPT-2's tokenizer files under their Hugging Face names (the same bytes)
    shutil.copyfile(Path(vocab_dir) / "encoder.json", out / "vocab.json")
    shutil.copyfile(Path(vocab_dir) / "vocab.bpe", out / "merges.txt")
    return out


def to_gguf(hf_folder: Path, out_dir: Path) -> dict[str, Path]:
    """F32 by the bundled converter, then Q8_0 and Q4_0 by llama-quantize from it: {"F32": path, ...}."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    f32 = out_dir / "model-F32.gguf"
    _run([sys.executable, CONVERTER, hf_folder, "--outtype", "f32", "--outfile", f32])
    paths = {"F32": f32}
    for quant in QUANTS:
        paths[quant] = out_dir / f"model-{quant}.gguf"
        _run([_need("llama-quantize"), f32, paths[quant], quant])
    return paths


# -- speed ---------------------------------------------------------------------------------------------------------

def _bench_one(gguf: Path, args: list[str], threads: int, reps: int) -> dict[str, Any]:
    """One llama-bench test (-o json): its mean, standard deviation and median over `reps` tokens/s samples."""
    out = _run([_need("llama-bench"), "-m", gguf, "-t", str(threads), "-r", str(reps), "-o", "json", *args])
    (test,) = json.loads(out.stdout)
    return {"avg_ts": test["avg_ts"], "stddev_ts": test["stddev_ts"], "median_ts": median(test["samples_ts"]),
            "samples_ts": test["samples_ts"], "n_prompt": test["n_prompt"], "n_gen": test["n_gen"],
            "n_depth": test["n_depth"], "type": test["model_type"]}


def llama_bench(gguf: Path, *, threads: int, prompt: int = 32, gen: int = 128, prefill: int = 128,
                reps: int = 5) -> dict[str, Any]:
    """llama-bench's decode and prefill tokens/s on one GGUF, batch 1, after its own warm-up run.

    Decode: `-p 0 -n GEN -d PROMPT`: GEN single-token steps on a cache already holding PROMPT tokens (the depth
    fill is outside the timing; each step's token is random, no sampling). Prefill: `-p PREFILL -n 0`: one batch of
    PREFILL tokens from an empty cache. Each repetition gives tokens / its seconds; llama-bench reports the mean
    (avg_ts) and standard deviation of those; the median is ours, from samples_ts."""
    decode = _bench_one(gguf, ["-p", "0", "-n", str(gen), "-d", str(prompt)], threads, reps)
    fill = _bench_one(gguf, ["-p", str(prefill), "-n", "0"], threads, reps)
    return {"gguf": str(gguf), "source": SOURCE, "threads": threads, "reps": reps, "type": decode["type"],
            "decode_tokens_per_s": decode["median_ts"], "decode": decode,
            "prefill_tokens_per_s": fill["median_ts"], "prefill": fill}


# -- quality -------------------------------------------------------------------------------------------------------

def plain_encoder(tokenizer_json: Path) -> Callable[[str], list[int]]:
    """A GPT folder's tokenizer.json as llama-perplexity tokenizes: special tokens' text is ordinary text."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.encode_special_tokens = True
    return lambda text: list(tok.encode(text, add_special_tokens=False).ids)


def llama_windows(text: str, tokenizer_encode: Callable[[str], list[int]], ctx: int, chunks: int, *,
                  bos: int | None = None) -> list[list[int]]:
    """The token windows `llama-perplexity -f FILE -c ctx --chunks chunks` runs when FILE holds `text`.

    `tokenizer_encode` must treat special tokens' text as text (`plain_encoder`); `bos`: the BOS id where the
    GGUF adds one (a GPT-2 GGUF does not: None)."""
    if text.endswith("\n"):  # llama.cpp's -f drops one trailing newline
        text = text[:-1]
    tokens = ([bos] if bos is not None else []) + tokenizer_encode(text)
    if len(tokens) < 2 * ctx:
        raise ValueError(f"{len(tokens)} tokens: llama-perplexity needs at least 2 * ctx = {2 * ctx}")
    windows = [tokens[i * ctx:(i + 1) * ctx] for i in range(min(chunks, len(tokens) // ctx))]
    if bos is not None:
        for window in windows:
            window[0] = bos
    return windows


def logits_file_windows(path: Path) -> list[list[int]]:
    """The token windows a `--kl-divergence-base` file records: the chunks as tokenized (where add_bos holds, each
    chunk's first token as read, before llama-perplexity overwrites it with BOS)."""
    with open(path, "rb") as f:
        if f.read(8) != LOGITS_MAGIC:
            raise ValueError(f"{path}: not a llama-perplexity logits file")
        n_ctx, _n_vocab, n_chunk = struct.unpack("<Iii", f.read(12))
        flat = struct.unpack(f"<{n_ctx * n_chunk}i", f.read(4 * n_ctx * n_chunk))
    return [list(flat[i * n_ctx:(i + 1) * n_ctx]) for i in range(n_chunk)]


_KL_LINES = {  # llama-perplexity's closing statistics -> our keys
    "mean_kl": r"Mean\s+KLD:\s*(\S+)", "max_kl": r"Maximum KLD:\s*(\S+)", "p99_kl": r"99\.0%\s+KLD:\s*(\S+)",
    "p99_9_kl": r"99\.9%\s+KLD:\s*(\S+)", "median_kl": r"Median\s+KLD:\s*(\S+)",
    "same_top_percent": r"Same top p:\s*(\S+)", "perplexity": r"Mean PPL\(Q\)\s*:\s*(\S+)",
    "reference_perplexity": r"Mean PPL\(base\)\s*:\s*(\S+)",
}


def parse_kl(log: str) -> dict[str, float]:
    """The figures of a `llama-perplexity --kl-divergence` log, as printed: KL to 6 decimals, so a quant within
    1e-5 of F32 keeps one significant digit (llama-perplexity prints them only over 100 positions or more)."""
    found: dict[str, float] = {}
    for key, pattern in _KL_LINES.items():
        match = re.search(pattern, log)
        if match is None:
            raise ValueError(f"llama-perplexity printed no {key!r} line:\n{log[-2000:]}")
        found[key] = float(match.group(1))
    found["same_top"] = found.pop("same_top_percent") / 100
    return found


def kl_base(base_gguf: Path, text_file: Path, logits_file: Path, *, ctx: int, chunks: int, threads: int) -> Path:
    """The F32 pass: writes the chunks' tokens and log-probabilities to `logits_file`."""
    _run([_need("llama-perplexity"), "-m", base_gguf, "-f", text_file, "-c", str(ctx), "--chunks", str(chunks),
          "-t", str(threads), "--kl-divergence-base", logits_file])
    return logits_file


def llama_kl(base_f32_gguf: Path, quant_gguf: Path, tokens_text_file: Path, *, threads: int, ctx: int = 128,
             chunks: int = 16, base_logits: Path | None = None) -> dict[str, Any]:
    """KL(P_F32 || P_quant) over llama-perplexity's windows (module docstring): mean, p99, max, same top token, and
    both perplexities on the scored positions. `base_logits`: the F32 pass's file, reused when it exists (one F32
    pass for every quant; it must come from the same F32 GGUF and text), else written there; None: a temporary file."""
    with tempfile.TemporaryDirectory() as tmp:
        logits = Path(base_logits) if base_logits is not None else Path(tmp) / "base.kld"
        if not logits.is_file():
            kl_base(base_f32_gguf, tokens_text_file, logits, ctx=ctx, chunks=chunks, threads=threads)
        done = _run([_need("llama-perplexity"), "-m", quant_gguf, "-c", str(ctx), "-t", str(threads),
                     "--kl-divergence-base", logits, "--kl-divergence"])
        windows = logits_file_windows(logits)
    width = len(windows[0])  # the base file's context, which governs the quant pass
    scored = len(windows) * (width - 1 - width // 2)
    return {"gguf": str(quant_gguf), "ctx": width, "chunks": len(windows), "positions": scored,
            **parse_kl(done.stdout + done.stderr)}


def write_text(out: Path, *, start: int = 200_000) -> Path:
    """The held-out text: the pydoc topics from character `start` on (`make demo` trains on the first 40,000)."""
    from mha_export.decoder.corpus import pydoc_topics

    Path(out).write_text(pydoc_topics().text[start:], encoding="utf-8")
    return Path(out)


# -- generation ----------------------------------------------------------------------------------------------------

def llama_greedy(gguf: Path, prompt: str, new: int, *, threads: int) -> str:
    """llama-completion's greedy continuation of `prompt` (top-k 1, the model's own context), the new text only."""
    done = _run([_need("llama-completion"), "-m", gguf, "-p", prompt, "-n", str(new), "--top-k", "1",
                 "-t", str(threads), "-no-cnv", "--no-display-prompt", "--ignore-eos", "--no-warmup", "-c", "0"])
    return done.stdout.removesuffix("\n\n")  # llama-completion ends its output with a blank line, always
