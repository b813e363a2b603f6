"""Where a decoder form's decode time goes, by op type: ONNX Runtime's own profiler over greedy steps.

    python -m benchmarks.op_profile artifacts/smollm2 --form gpt.inplace.int4.onnx --steps 40

A 32-token prompt, then `steps` greedy steps through mha_runtime's decoder (as `mha generate` drives it); the
profile's kernel time is summed by op type and by node for the slowest MatMulNBits. The profiler's own cost
lengthens every step, so read the differences between forms, not the sums (docs/measurements/smollm2.md).
"""
from __future__ import annotations

import collections
import json
import tempfile
from pathlib import Path

import click
import numpy as np
import onnxruntime as ort

from mha_runtime.decoder.contract import CONCAT_FORM, INPLACE_FORM
from mha_runtime.decoder.decoder import decoder_for
from mha_runtime.decoder.manifest import load_gpt_manifest


def profile(folder: Path, form: str, steps: int, threads: int) -> dict[str, object]:
    """Kernel milliseconds per op type and for the three slowest MatMulNBits nodes, over a prefill and `steps`
    decode steps, and their sum per step."""
    shapes = load_gpt_manifest(folder).shapes
    with tempfile.TemporaryDirectory(prefix="mha-op-profile-") as tmp:
        options = ort.SessionOptions()
        options.enable_profiling, options.intra_op_num_threads = True, threads
        options.profile_file_prefix = str(Path(tmp) / "profile")
        session = ort.InferenceSession(str(folder / form), options, providers=["CPUExecutionProvider"])
        decoder = decoder_for("concat" if form == CONCAT_FORM else "inplace", session, shapes, folder / form)
        logits = decoder.prefill([[int(i) for i in range(1, 33)]])  # (1, V)
        for _ in range(steps):
            logits = decoder.step([int(np.argmax(logits[0]))], [True])
        events = json.loads(Path(session.end_profiling()).read_text())
    by_op: collections.Counter[str] = collections.Counter()
    nbits: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"].get("op_name", "?")] += e["dur"]
            if e["args"].get("op_name") == "MatMulNBits":
                nbits[e["name"].removesuffix("_kernel_time")] += e["dur"]
    return {"form": form, "steps": steps, "threads": threads,
            "ms_by_op": {op: round(us / 1e3, 1) for op, us in by_op.most_common()},
            "slowest_matmulnbits_ms": {n: round(us / 1e3, 1) for n, us in nbits.most_common(3)},
            "ms_per_step": round(sum(by_op.values()) / 1e3 / (steps + 1), 2)}


@click.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--form", default=INPLACE_FORM, show_default=True, help="the ONNX form of the folder to profile")
@click.option("--steps", default=40, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--threads", default=2, show_default=True, type=click.IntRange(1, 256))
def main(folder: Path, form: str, steps: int, threads: int) -> None:
    """Profile FOLDER's FORM over greedy decode steps; print the figures as JSON."""
    if not (folder / form).is_file():
        raise click.BadParameter(f"expected an ONNX form of the folder, got {form!r} (not in {folder})",
                                 param_hint="--form")
    click.echo(json.dumps(profile(folder, form, steps, threads), indent=1))


if __name__ == "__main__":
    main()
