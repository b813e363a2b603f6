"""`mha serve`, `mha loadtest` and `mha triton`: the artifact behind HTTP, a bounded load on it, a Triton repository."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from mha_runtime.artifact.errors import BadValueError
from mha_runtime.attention.registry import ONNX
from mha_runtime.cli.options import BATCH, MAX_BATCH_WAIT_MS, REPLICAS, THREADS, Finite, RayAddress
from mha_runtime.infer.providers import CHOICES


@click.command("serve")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--model", default=None,
              help=f"Which ONNX file of the folder to serve [default: {ONNX.file}; for a GPT folder gpt.inplace.onnx].")
@click.option("--replicas", type=REPLICAS, default=1, show_default=True,
              help="Replicas, each one process holding one runner.")
@click.option("--max-batch", type=BATCH, default=16, show_default=True,
              help="Most requests in one ONNX Runtime call (1: no batching); for a GPT folder, the generations "
                   "stepped together (slots).")
@click.option("--batch-wait-ms", type=Finite(min=0.0, max=MAX_BATCH_WAIT_MS), default=0.0, show_default=True,
              help="How long a batch waits to fill; 0 batches what queued while the previous batch ran.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the HTTP proxy listens on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--address", type=RayAddress(), default=None,
              help="Join this Ray cluster (host:port of `ray start --head`, ray://host:port, auto); default: start "
                   "a local Ray instance.")
@click.option("--provider", type=click.Choice(CHOICES), default="cpu", show_default=True)
@click.option("--threads", type=THREADS, default=1, show_default=True,
              help="Intra-op threads per replica.")
@click.option("--ingress", type=click.Choice(["proxy", "haproxy"]), default=None,
              help="Ray Serve's HTTP proxy, or HAProxy in front of the replicas (its stats and metrics pages listen "
                   "on every interface, as Ray's own ports do).  [default: haproxy for a GPT folder without "
                   "--address, else proxy]")
def serve_cmd(artifact_dir: Path, model: str | None, replicas: int, max_batch: int, batch_wait_ms: float, host: str,
              port: int, address: str | None, provider: str, threads: int, ingress: str | None) -> None:
    """Serve an artifact over HTTP with Ray Serve until SIGTERM, which drains it: POST /v1/context, or for a GPT
    folder POST /v1/generate."""
    from mha_runtime.serve.launcher import serve
    from mha_runtime.serve.options import ServeOptions

    serve(ServeOptions(artifact=artifact_dir, model=model, replicas=replicas, max_batch=max_batch,
                       batch_wait_ms=batch_wait_ms, host=host, port=port, address=address, provider=provider,
                       threads=threads, ingress=ingress))


def _int_list(value: str, option: str, noun: str = "counts") -> list[int]:
    """Comma-separated counts, each at least 1, refused before the server is asked anything (the folder's own
    limits are checked once it is read)."""
    try:
        numbers = [int(t) for t in value.split(",") if t.strip()]
    except ValueError:
        numbers = []  # the same refusal as no numbers at all
    if not numbers:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}", param_hint=option)
    if min(numbers) < 1:
        raise BadValueError(f"{option}: expected {noun} >= 1, got {numbers}")
    return numbers


@click.command("loadtest")
@click.argument("url")
@click.option("--artifact", "artifact_dir", type=click.Path(path_type=Path), required=True,
              help="The artifact folder the server was started with: every answer is checked against it locally.")
@click.option("--requests", type=click.IntRange(min=1), default=200, show_default=True, help="Requests to send.")
@click.option("--concurrency", type=click.IntRange(min=1, max=256), default=8, show_default=True,
              help="Requests in flight at once (one connection each).")
@click.option("--tokens", default="16,64,256", show_default=True,
              help="Comma-separated token counts, drawn at random per request.")
@click.option("--batch", "batches", default="1", show_default=True,
              help="Comma-separated batch sizes, drawn at random per request.")
@click.option("--format", "fmt", type=click.Choice(["npy", "json"]), default="npy", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--max-seconds", type=Finite(min=0.1), default=300.0, show_default=True,
              help="No request starts after this.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None, help="Also write the figures here.")
@click.option("--generate", is_flag=True,
              help="Load a GPT server's POST /v1/generate; --artifact is its GPT folder.")
@click.option("--prompt-tokens", default="8,32,128", show_default=True,
              help="With --generate: comma-separated prompt lengths, drawn at random per request.")
@click.option("--max-new-tokens", default="16,64", show_default=True,
              help="With --generate: comma-separated max_new_tokens, drawn at random per request.")
@click.option("--stream", "stream_share", type=Finite(0.0, 1.0), default=0.5, show_default=True,
              help="With --generate: the share of requests streamed (SSE); the rest get one JSON answer.")
@click.option("--sample", "sample_share", type=Finite(0.0, 1.0), default=0.5, show_default=True,
              help="With --generate: the share of requests sampled with a seed; the rest are greedy.")
@click.pass_context
def loadtest_cmd(ctx: click.Context, url: str, artifact_dir: Path, requests: int, concurrency: int, tokens: str,
                 batches: str, fmt: str, seed: int, max_seconds: float, json_path: Path | None, generate: bool,
                 prompt_tokens: str, max_new_tokens: str, stream_share: float, sample_share: float) -> None:
    """Bounded load on a loopback `mha serve`: throughput, latency percentiles, and every answer checked."""
    from mha_runtime.artifact.atomic import check_file_target, write_file_atomic
    from mha_runtime.serve.attention.loadtest import loadtest, report_lines

    # Options of the other kind of load are refused rather than ignored.
    other = ("tokens", "batches", "fmt") if generate else ("prompt_tokens", "max_new_tokens", "stream_share",
                                                          "sample_share")
    given = [p.opts[0] for p in ctx.command.params
             if p.name in other and ctx.get_parameter_source(p.name) != click.core.ParameterSource.DEFAULT]
    if given:
        raise click.UsageError(f"{', '.join(given)}: {'not' if generate else 'only'} with --generate")
    if seed < 0:
        raise BadValueError(f"--seed: expected an integer >= 0, got {seed}")
    if json_path is not None:  # before the load, not after it
        check_file_target(json_path, "--json")
    if generate:
        from mha_runtime.serve.decoder.loadtest import gen_loadtest, gen_report_lines

        summary = gen_loadtest(url, artifact_dir, requests=requests, concurrency=concurrency,
                               prompt_tokens=_int_list(prompt_tokens, "--prompt-tokens"),
                               max_new_tokens=_int_list(max_new_tokens, "--max-new-tokens"),
                               stream_share=stream_share, sample_share=sample_share, seed=seed,
                               max_seconds=max_seconds)
        lines = gen_report_lines(summary)
    else:
        summary = loadtest(url, artifact_dir, requests=requests, concurrency=concurrency,
                           tokens=_int_list(tokens, "--tokens"), batches=_int_list(batches, "--batch", "sizes"),
                           fmt=fmt, seed=seed, max_seconds=max_seconds)
        lines = report_lines(summary)
    click.echo("\n".join(lines))
    if json_path is not None:
        write_file_atomic(json_path, (json.dumps(summary, indent=2) + "\n").encode())
    if summary["errors"] or summary["not_sent"]:
        click.echo(f"load test failed: {summary['errors']} error(s), {summary['not_sent']} request(s) not sent",
                   err=True)
        sys.exit(1)


@click.command("triton")
@click.argument("artifact_dir", type=click.Path(path_type=Path))
@click.option("--out", "repo", type=click.Path(path_type=Path), required=True,
              help="The model repository; other models already in it are left alone.")
@click.option("--name", default=None, help="Model name prefix (default: the artifact's name).")
@click.option("--model", default=ONNX.file, show_default=True, help="Which ONNX file of the folder.")
@click.option("--max-batch", type=BATCH, default=8, show_default=True,
              help="max_batch_size of both configs.")
def triton_cmd(artifact_dir: Path, repo: Path, name: str | None, model: str, max_batch: int) -> None:
    """Write a Triton Inference Server model repository: <name>_onnx and <name>_torchscript."""
    from mha_runtime.artifact.atomic import check_folder_target, staged_folder
    from mha_runtime.kinds import kind_of

    kind = kind_of(artifact_dir)
    triton_models = kind.needs(kind.triton, "triton", artifact_dir)
    models = triton_models(artifact_dir, name=name, model=model, max_batch=max_batch)
    for triton_model in models:  # every model's place first: a refusal of the second left the first written
        check_folder_target(repo / triton_model.name)
    for triton_model in models:  # each model folder swapped in whole, only once written
        with staged_folder(repo / triton_model.name) as stage:
            triton_model.write(stage)
        click.echo(f"wrote {repo / triton_model.name} ({triton_model.platform}, {triton_model.input_name} -> "
                   f"{triton_model.output_name})")
    click.echo(f"serve it elsewhere with: tritonserver --model-repository={repo.resolve()}")
