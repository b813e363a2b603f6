"""The CUDA rows, measured where a GPU is lent: where each form's nodes run, and `mha check --provider cuda`.

Repository tooling, torch-free (the runtime package and onnxruntime-gpu only). For every `.onnx` file of each
folder it opens a session on [CUDA, CPU] with ONNX Runtime's verbose log and counts the nodes placed on each
provider (ONNX Runtime places what CUDA has no kernel for on the CPU, silently at the default log level), then runs
the folder's own check on that provider, which compares every form with the eager-PyTorch outputs recorded at
export. A session whose providers lack CUDA (onnxruntime-gpu missing its CUDA libraries) fails the run: a CUDA
row measured on the CPU would be a wrong row. Writes `<out>/placement.json` and `<out>/<folder>.<provider>.json`.

    python tools/cuda_check.py --out DIR FOLDER...      (--provider cpu: a dry run on a machine without a GPU)
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click

# ONNX Runtime's verbose placement summary: " All nodes placed on [CUDAExecutionProvider]. Number of nodes: 12" or
# " Node(s) placed on [CPUExecutionProvider]. Number of nodes: 5" followed by one "  OpType (node name)" per node.
PLACED = re.compile(r"(?:All nodes|Node\(s\)) placed on \[(\w+)\]\. Number of nodes: (\d+)")
NODE = re.compile(r"^\s+(\w+) \((.*)\)\s*$")
ORT_NAMES = {"cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"], "cpu": ["CPUExecutionProvider"]}

# The session the runtime makes (its provider list and options), with the verbose log on.
_OPEN = """
import sys, onnxruntime as ort
from mha_runtime.infer.providers import session_providers
options = ort.SessionOptions()
options.log_severity_level = 0
session = ort.InferenceSession(sys.argv[1], options, providers=session_providers(sys.argv[2]))
print("PROVIDERS=" + ",".join(session.get_providers()), flush=True)
"""


def placement(model: Path, provider: str) -> dict[str, object]:
    """Which provider runs how many nodes of `model` (and which op types fall back to the CPU)."""
    proc = subprocess.run([sys.executable, "-c", _OPEN, str(model), provider],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    providers = next(line.split("=", 1)[1].split(",") for line in proc.stdout.splitlines()
                     if line.startswith("PROVIDERS="))
    counts: dict[str, int] = {}
    cpu_ops: dict[str, int] = {}
    current = None
    for line in proc.stderr.splitlines():
        text = line.split("] ", 1)[-1] if "] " in line else line
        found = PLACED.search(text)
        if found:
            current = found.group(1)
            counts[current] = counts.get(current, 0) + int(found.group(2))
            continue
        node = NODE.match(text)
        if node is None:
            current = None
        elif current == "CPUExecutionProvider" and provider != "cpu":
            cpu_ops[node.group(1)] = cpu_ops.get(node.group(1), 0) + 1
    return {"providers": providers, "nodes": counts, "cpu_ops": cpu_ops}


def check(folder: Path, provider: str, out: Path) -> tuple[int, str]:
    """`mha check FOLDER --provider P --json`: its exit status and its printed table."""
    target = out / f"{folder.name}.{provider}.json"
    proc = subprocess.run([sys.executable, "-c", "from mha_runtime.cli.main import main; main()", "check",
                           str(folder), "--provider", provider, "--json", str(target)],
                          capture_output=True, text=True, timeout=1200)
    return proc.returncode, proc.stdout + proc.stderr


@click.command()
@click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path))
@click.option("--provider", type=click.Choice(sorted(ORT_NAMES)), default="cuda", show_default=True)
def main(folders: tuple[Path, ...], out: Path, provider: str) -> None:
    """Placement and golden check of every form of FOLDERS on PROVIDER."""
    import onnxruntime as ort

    out.mkdir(parents=True, exist_ok=True)
    click.echo(f"onnxruntime {ort.__version__} ({ort.get_device()}): {', '.join(ort.get_available_providers())}")
    report: dict[str, dict[str, object]] = {}
    wrong = []
    for folder in folders:
        for model in sorted(folder.glob("*.onnx")):
            row = placement(model, provider)
            report[f"{folder.name}/{model.name}"] = row
            if ORT_NAMES[provider][0] not in row.get("providers", []):
                wrong.append(f"{folder.name}/{model.name}: {row.get('error') or row.get('providers')}")
            click.echo(f"{folder.name}/{model.name}: {json.dumps({k: v for k, v in row.items() if k != 'providers'})}")
    (out / "placement.json").write_text(json.dumps(report, indent=1) + "\n")
    status = 0
    for folder in folders:
        code, table = check(folder, provider, out)
        click.echo(f"--- mha check {folder.name} --provider {provider}: exit {code}\n{table}")
        status |= code
    if wrong:
        click.echo(f"not on {ORT_NAMES[provider][0]}: " + "; ".join(wrong))
        sys.exit(1)
    sys.exit(status)


if __name__ == "__main__":
    main()
