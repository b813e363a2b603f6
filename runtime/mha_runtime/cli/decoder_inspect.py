"""`mha inspect` on a decoder folder: its architecture, config and shapes (contract.shapes), versions, weights, every
decoder form with how it was judged (a lossy form: its quality beside fp32 and its quantization plan), and the files.

What it shows of a form is what `mha check` compares or what the files themselves say: the dtype and the bar are
the contract's (mha_runtime.decoder.contract), a lossy ONNX form's plan is read from its graph
(mha_runtime.decoder.graph_plan), and its quality figures are those `mha check` measures again and compares, shown
only once they are possible figures (Quality.from_dict). A form's distance from eager PyTorch is read from the
golden files `mha check` runs it on (each listed with its sha256): how many cases it must reproduce and, for a form
with its own generations (a lossy one), how far its first-step logits are from eager's and in how many cases its
ids are eager's; an fp32 form reproduces eager's own within the contract's row. The export's validation figures
(max_abs_error, greedy_agreement, cases) stay in the manifest (`--json`), not in the table: no check measures them
again. A GGUF quant type's quality figures are llama.cpp's against gpt.gguf, measured again by `mha check` where
llama.cpp is built.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import click
import numpy as np

from mha_runtime.artifact.errors import MHAError, first_line
from mha_runtime.cli.tables import human_size, shown, table
from mha_runtime.decoder.forms import FORMS, folder_bar
from mha_runtime.decoder.golden import GENERATIONS_FILE, GoldenGeneration, first_logits, load_generations
from mha_runtime.decoder.graph_plan import GraphPlan, read_graph_plan
from mha_runtime.decoder.manifest import GPTArtifact, GPTManifest, load_gpt_manifest
from mha_runtime.decoder.quality import Quality, Windows, load_windows
from mha_runtime.decoder.record_check import contract_form
from mha_runtime.decoder.shapes import cache_rows

HEADERS = ["artifact", "dtype", "size", "golden cases", "first step vs eager (max abs)", "ids = eager's",
           "mean KL (p99)", "same top token", "kept higher"]


def _quality(file: str, a: GPTArtifact, windows: Windows | str) -> Quality | str | None:
    """A lossy form's recorded figures, or why they are refused (a line, as `mha check` refuses them before it
    measures), or None (not a lossy form)."""
    if a.quality is None:
        return None
    try:
        recorded = Quality.from_dict(a.quality, f"artifacts.{file}.quality")
    except MHAError as exc:
        return first_line(exc)
    mismatch = windows if isinstance(windows, str) else windows.mismatch(recorded)
    return recorded if mismatch is None else mismatch


def _windows(folder: Path, manifest: GPTManifest) -> Windows | str:
    """The quality windows the figures must be of, or why they cannot be read."""
    try:
        return load_windows(folder, manifest)
    except MHAError as exc:
        return first_line(exc)


def _graph(folder: Path, file: str) -> GraphPlan | str | None:
    """A lossy ONNX form's plan read from its graph, or why it could not be read, or None (not one)."""
    form = FORMS.get(file)
    if form is None or not form.lossy or not (folder / file).is_file():
        return None
    try:
        return read_graph_plan(folder / file)
    except MHAError as exc:
        return first_line(exc)


def _kept(plan: GraphPlan | str | None, file: str) -> str:
    """How many weights the graph holds above the form's bits (fp32 MatMuls, wider MatMulNBits)."""
    if not isinstance(plan, GraphPlan):
        return "-"
    bits = FORMS[file].bits or 0
    return str(len(plan.fp32) + sum(q.bits > bits for q in plan.quantized.values()))


Golden = Callable[[str], tuple[list[GoldenGeneration], dict[str, np.ndarray]]]  # file -> cases, first logits


def _golden(folder: Path, manifest: GPTManifest) -> Golden:
    """A golden file's cases and first-step logits by case name, each file read and hashed once."""
    @functools.cache
    def read(file: str) -> tuple[list[GoldenGeneration], dict[str, np.ndarray]]:
        cases = load_generations(folder, manifest, file).cases
        return cases, {c.name: first_logits(folder, manifest, c, manifest.shapes.vocab_size) for c in cases}
    return read


def _versus_eager(golden: Golden, file: str, a: GPTArtifact) -> list[str]:
    """[golden cases, first-step max abs from eager's, cases whose ids are eager's] from the sealed golden files:
    the form's own generations against eager's (golden/generations.json); a form that reproduces eager's own shows
    its contract row's atol and 'all' (mha check holds it to them)."""
    own = a.generations or GENERATIONS_FILE
    try:
        cases, logits = golden(own)
        if own == GENERATIONS_FILE:
            form = contract_form(file)
            return [str(len(cases)), "-" if form is None else f"<={form.tolerance.atol:g}", "all"]
        eager_cases, eager_logits = golden(GENERATIONS_FILE)
        eager = {c.name: c for c in eager_cases}
        pairs = [(c, eager[c.name]) for c in cases if c.name in eager]
        far = max((float(np.abs(logits[c.name] - eager_logits[c.name]).max()) for c, _ in pairs), default=float("nan"))
        return [str(len(cases)), f"{far:.2e}", f"{sum(c.ids == e.ids for c, e in pairs)}/{len(pairs)}"]
    except MHAError:  # a broken golden file: mha check names it
        return ["-", "-", "-"]


def _row(folder: Path, file: str, a: GPTArtifact, manifest: GPTManifest, windows: Windows | str,
         golden: Golden) -> list[str]:
    size = human_size(manifest.files[file].size) if file in manifest.files else "-"
    form = contract_form(file)
    q = _quality(file, a, windows)  # the figures `mha check` measures again
    kl = f"{q.mean_kl:.2e} ({q.p99_kl:.2e})" if isinstance(q, Quality) else "-"
    same = f"{100 * q.same_top:.1f}%" if isinstance(q, Quality) else "-"
    dtype = shown(a.dtype) if form is None else form.dtype
    return [file, dtype, size, *_versus_eager(golden, file, a), kl, same, _kept(_graph(folder, file), file)]


def _lossy_line(folder: Path, file: str, a: GPTArtifact, windows: Windows | str) -> str:
    """One lossy form: its quality against the contract's bar, and its plan from the graph."""
    form = contract_form(file)
    bar_value = None if form is None else folder_bar(form, (a.quality or {}).get("bar_mean_kl"))
    bar = "?" if bar_value is None else f"{bar_value:g}"
    q = _quality(file, a, windows)
    if isinstance(q, Quality):
        figures = f"mean KL divergence from fp32 {q.mean_kl:.3g} (bar {bar}) over {q.positions} positions"
    else:
        figures = f"recorded quality refused: {q} (bar {bar})"
    if file not in FORMS:  # a GGUF quant type: measured by llama.cpp against gpt.gguf, at export and by mha check
        return f"{file}: {figures}, by llama.cpp against gpt.gguf"
    plan = _graph(folder, file)
    how = plan.line() if isinstance(plan, GraphPlan) else f"the graph could not be read ({plan})"
    return f"{file}: {figures}; {how}"


def inspect_gpt(folder: Path, *, as_json: bool) -> None:
    folder = Path(folder)
    manifest = load_gpt_manifest(folder)
    if as_json:
        click.echo(json.dumps(manifest.to_dict(), indent=2))
        return
    c = manifest.shapes
    click.echo(f"name     {shown(manifest.name)} (decoder, {shown(c.arch)})  created {shown(manifest.created)}")
    click.echo(f"config   {json.dumps(manifest.config)}")
    rows = cache_rows(c)
    short = [n for n in rows if n < c.context_length]  # the layers that keep only their sliding window
    windowed = f" ({len(short)} keep only their window: {'/'.join(map(str, sorted(set(short))))} rows)" if short else ""
    click.echo(f"shapes   {c.n_layers} layers, {c.n_heads} query heads, {c.kv_heads} key/value heads of "
               f"{c.head_dim}; cache [batch, {c.kv_heads}, {c.context_length}, {c.head_dim}] per layer{windowed}")
    click.echo(f"limits   1 <= prompt + new tokens <= {c.context_length}, token ids 0..{c.vocab_size - 1}")
    click.echo(f"versions {json.dumps(manifest.versions)}")
    click.echo(f"weights  {json.dumps(manifest.weights)}")
    tokenizer = "none (token ids only)" if manifest.tokenizer is None else json.dumps(manifest.tokenizer)
    stops = ", ".join(map(str, manifest.stop_ids)) or "none"  # what every runtime stops at (GPTManifest.stop_ids)
    click.echo(f"tokenizer {tokenizer}  eos ids {stops}\n")
    lossy = any(a.quality is not None for a in manifest.artifacts.values())
    windows = _windows(folder, manifest) if lossy else "no lossy form"
    golden = _golden(folder, manifest)
    click.echo(table(HEADERS, [_row(folder, f, a, manifest, windows, golden) for f, a in manifest.artifacts.items()])
               + "\n")
    for file, a in manifest.artifacts.items():
        form = contract_form(file)
        if a.quality is not None and (form is None or form.lossy):
            # shown(): the manifest's own names, escaped where an edit put a newline in them (it would forge a line)
            click.echo(shown(_lossy_line(folder, file, a, windows)))
    click.echo("\n" + table(["file", "size", "sha256"],
                            [[f, human_size(r.size), r.sha256[:16]] for f, r in manifest.files.items()]))
