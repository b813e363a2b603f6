"""`mha loadtest --generate`: a bounded load of `POST /v1/generate` requests on a loopback `mha serve` of a GPT
folder, every answer checked against a local Generator on the same request.

Request i is made from (seed, i) alone: a prompt of random ids, its length and max_new_tokens drawn from the
lists, streamed or not, greedy or seeded sampling. Answers are kept and judged once the load is over (the local
generation would take CPU from the server otherwise). Greedy ids must be identical, seeded samples identical,
the stop reason the same, and a stream's `token` events must carry exactly the `done` event's ids, in order.

Timing: the client notes when each SSE event has fully arrived. Time to first token is measured on streamed
requests (send -> first `token` event); the server's own time_to_first_token_s is reported beside it for every
answer. Inter-token latency is the gap between consecutive `token` events of one stream.
"""
from __future__ import annotations

import http.client
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mha_runtime.artifact.errors import BadValueError, MHAError, ServeError
from mha_runtime.artifact.manifest import DECODER_KIND, kind_named
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.manifest import load_gpt_manifest
from mha_runtime.decoder.shapes import DecoderShapes
from mha_runtime.serve.attention.loadtest import FAILURES, get_json, loopback_target, ms_text, percentiles_ms
from mha_runtime.serve.decoder.answers import GenOutcome, check_generations, reference_for
from mha_runtime.serve.decoder.wire import GENERATE, GenerateRequest
from mha_runtime.serve.http import CONTRACT, SSE
from mha_runtime.serve.load_runner import run_pool

REQUEST_TIMEOUT_S = 300.0
# A sampled request draws its temperature and top_k from these (top_k capped at the vocabulary).
TEMPERATURES = (0.7, 1.0, 1.3)
TOP_KS = (None, 40)


def generate_requests(shapes: DecoderShapes, *, prompt_tokens: Sequence[int], max_new_tokens: Sequence[int], seed: int,
                      stream_share: float, sample_share: float) -> Callable[[int], GenerateRequest]:
    """Request i, the same for a given (seed, i) whichever thread sends it (the check makes it again). Every draw
    happens in a fixed order, so the shares change only what they decide, not the prompts."""
    top_ks = tuple(k if k is None else min(k, shapes.vocab_size) for k in TOP_KS)

    def request(i: int) -> GenerateRequest:
        rng = np.random.default_rng([seed, i])
        length, new = int(rng.choice(prompt_tokens)), int(rng.choice(max_new_tokens))
        ids = [int(t) for t in rng.integers(0, shapes.vocab_size, length)]
        stream, sample = bool(rng.random() < stream_share), bool(rng.random() < sample_share)
        temperature = float(TEMPERATURES[int(rng.integers(len(TEMPERATURES)))])
        top_k = top_ks[int(rng.integers(len(top_ks)))]
        sample_seed = int(rng.integers(0, 2**31))
        if not sample:
            return GenerateRequest(ids, new, stream=stream)
        return GenerateRequest(ids, new, temperature, top_k, sample_seed, stream)
    return request


def _read_events(response: http.client.HTTPResponse, sent: float) -> list[tuple[float, bytes]]:
    """An event stream read line by line as it arrives: each event's bytes and when its blank line came."""
    events: list[tuple[float, bytes]] = []
    lines: list[bytes] = []
    for line in iter(response.readline, b""):
        if line.strip():
            lines.append(line)
        elif lines:
            events.append((time.perf_counter() - sent, b"".join(lines)))
            lines = []
    if lines:  # a last event without its blank line: kept, and judged
        events.append((time.perf_counter() - sent, b"".join(lines)))
    return events


def _send(connection: http.client.HTTPConnection, index: int, request: GenerateRequest) -> GenOutcome:
    """One request on a kept-alive connection; an exception (no answer) is left to the caller."""
    body = json.dumps(request.to_json()).encode()
    sent = time.perf_counter()
    connection.request("POST", GENERATE, body=body, headers={"Content-Type": "application/json",
                                                             "Accept": SSE if request.stream else "application/json"})
    response = connection.getresponse()
    outcome = GenOutcome(index, response.status, 0.0, request.stream)
    kind = response.getheader("content-type") or ""
    if response.status != 200:
        raw = response.read()
        outcome.problem = f"unexpected: request {index}: status {response.status} ({raw[:160]!r})"
    elif request.stream and kind.split(";")[0].strip() == SSE:
        outcome.events = _read_events(response, sent)
    else:
        outcome.body = response.read()
        if request.stream:
            outcome.problem = f"wrong: request {index}: streamed, but answered with Content-Type {kind!r}"
    outcome.seconds = time.perf_counter() - sent
    return outcome


P50_P90 = (("p50", 50.0), ("p90", 90.0))


def summarize_generations(outcomes: list[GenOutcome], seconds: float, *, count: int) -> dict[str, Any]:
    """Throughput in new tokens, time to first token, inter-token latency, and every kind of failure counted."""
    good = [o for o in outcomes if o.problem is None]
    kinds = {kind: sum(1 for o in outcomes if o.problem and o.problem.startswith(kind + ":")) for kind in FAILURES}
    new_tokens = sum(o.new_tokens for o in good)
    streamed = [o for o in good if o.stream]
    return {
        "requests": count, "sent": len(outcomes), "not_sent": count - len(outcomes), "seconds": seconds,
        "answered": len(good), "streamed": len(streamed), "new_tokens": new_tokens,
        "tokens_per_s": new_tokens / seconds if seconds else 0.0,
        "requests_per_s": len(good) / seconds if seconds else 0.0,
        "ttft_ms": percentiles_ms([o.ttft_s for o in streamed if o.ttft_s is not None], P50_P90),
        "ttft_source": "client: from sending the request to the arrival of its first token event (streamed requests)",
        "server_ttft_ms": percentiles_ms([o.server_ttft_s for o in good if o.server_ttft_s is not None], P50_P90),
        "inter_token_ms": percentiles_ms([g for o in streamed for g in o.gaps_s], P50_P90),
        "latency_ms": percentiles_ms([o.seconds for o in good], (*P50_P90, ("p99", 99.0), ("max", 100.0))),
        "stops": dict(Counter(o.stop for o in good if o.stop is not None)),
        "errors": sum(kinds.values()), **kinds,
        "problems": [o.problem for o in sorted(outcomes, key=lambda o: o.index) if o.problem][:10],
    }


def check_lengths(shapes: DecoderShapes, prompt_tokens: Sequence[int], max_new_tokens: Sequence[int]) -> None:
    """Refuse, in one line and before anything is sent, lists that could ask for more than context_length."""
    context = shapes.context_length
    if not prompt_tokens or min(prompt_tokens) < 1:
        raise BadValueError(f"--prompt-tokens: expected counts >= 1, got {list(prompt_tokens)}")
    if not max_new_tokens or min(max_new_tokens) < 1:
        raise BadValueError(f"--max-new-tokens: expected counts >= 1, got {list(max_new_tokens)}")
    longest, most = max(prompt_tokens), max(max_new_tokens)
    if longest + most > context:
        raise BadValueError(f"--prompt-tokens {longest} + --max-new-tokens {most} = {longest + most} runs past "
                            f"context_length {context}; keep every prompt + max_new_tokens within {context}")


def gen_loadtest(url: str, artifact: Path, *, requests: int, concurrency: int, prompt_tokens: Sequence[int],
                 max_new_tokens: Sequence[int], stream_share: float = 0.5, sample_share: float = 0.5, seed: int = 0,
                 max_seconds: float = 300.0, threads: int | None = None,
                 generator: Generator | None = None) -> dict[str, Any]:
    """The load `mha loadtest --generate` sends, every answer checked after the load against a Generator on the
    local GPT folder `artifact` (or `generator`, already made from it)."""
    host, port = loopback_target(url)
    if seed < 0:
        raise BadValueError(f"--seed: expected an integer >= 0, got {seed}")
    for name, share in (("--stream", stream_share), ("--sample", sample_share)):
        if not 0.0 <= share <= 1.0:
            raise BadValueError(f"{name}: expected a share in 0..1, got {share}")
    info = get_json(host, port, CONTRACT)  # nothing listening is one line, before the folder is loaded
    if not isinstance(info, dict) or kind_named(info.get("kind")) != DECODER_KIND:  # "gpt": a server before it
        raise ServeError(f"{url} does not serve a decoder folder (its {CONTRACT} has no kind {DECODER_KIND!r}): "
                         "load test an attention artifact without --generate")
    if generator is not None:
        local = generator
    else:  # the reference runs the decoder file the server runs, when the local folder lists it
        listed = load_gpt_manifest(artifact).artifacts
        local = Generator(artifact, form=info.get("model") if info.get("model") in listed else None, threads=threads)
    check_lengths(local.shapes, prompt_tokens, max_new_tokens)
    record = local.manifest.files.get(str(info.get("model")))
    same = record is not None and record.sha256 == info.get("sha256")
    made = generate_requests(local.shapes, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, seed=seed,
                             stream_share=stream_share, sample_share=sample_share)
    outcomes, seconds = run_pool(host, port, made, send=_send, count=requests, concurrency=concurrency,
                                 max_seconds=max_seconds, timeout_s=REQUEST_TIMEOUT_S,
                                 reconnect=lambda outcome: outcome.status != 200 or bool(outcome.problem),
                                 lost=lambda i, request, took, why: GenOutcome(i, None, took, request.stream,
                                                                               problem=f"lost: request {i}: {why}"))
    tokenizer = local.tokenizer
    try:
        check_generations(outcomes, made, reference_for(local), tokenizer.decode if tokenizer else None)
    except MHAError as exc:  # the local folder refused a request the server took
        raise ServeError(f"{artifact}: the local generation failed ({exc})") from None
    summary = summarize_generations(outcomes, seconds, count=requests)
    # Each answered request's prompt length with its times to first token (client: streamed only; server): a bench
    # compares each with a solo prefill of the same length.
    summary["first_token_ms"] = [[len(made(o.index).prompt_ids), _ms_or_none(o.ttft_s), _ms_or_none(o.server_ttft_s)]
                                 for o in outcomes if o.problem is None]
    # Of the requests sent: --requests may be far past what --max-seconds let out (10**12 took hours here).
    sampled = sum(1 for o in outcomes if made(o.index).temperature > 0)
    summary.update(url=url, artifact=str(artifact), form=local.form, served=info.get("model"), same_model=same,
                   concurrency=concurrency, prompt_tokens=list(prompt_tokens), max_new_tokens=list(max_new_tokens),
                   stream_share=stream_share, sample_share=sample_share, sampled=sampled, seed=seed,
                   max_seconds=max_seconds)
    return summary


def _ms_or_none(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def gen_report_lines(summary: dict[str, Any]) -> list[str]:
    """The generation load test's printout: what was sent, throughput, TTFT, inter-token latency, failures."""
    stops = ", ".join(f"{n} {k}" for k, n in sorted(summary["stops"].items())) or "-"
    lines = [
        f"{summary['sent']} of {summary['requests']} generate requests in {summary['seconds']:.1f} s, concurrency "
        f"{summary['concurrency']}, prompt tokens {','.join(map(str, summary['prompt_tokens']))}, max new tokens "
        f"{','.join(map(str, summary['max_new_tokens']))}; {summary['streamed']} answered streamed, "
        f"{summary['sampled']} of {summary['sent']} sampled with a seed (the rest greedy)",
        f"throughput  {summary['tokens_per_s']:.1f} new tokens/s ({summary['new_tokens']} new tokens over the wall "
        f"time), {summary['requests_per_s']:.2f} requests/s",
        f"ttft ms     {ms_text(summary['ttft_ms'], ('p50', 'p90'))} (client: send -> first token event, streamed); "
        f"server-reported {ms_text(summary['server_ttft_ms'], ('p50', 'p90'))} (all answers)",
        f"inter-token {ms_text(summary['inter_token_ms'], ('p50', 'p90'))} ms (gaps between streamed token events)",
        f"latency ms  {ms_text(summary['latency_ms'], ('p50', 'p90', 'p99'))} (send -> last byte)",
        f"stops       {stops}",
        f"errors      {summary['errors']} ({summary['lost']} lost, {summary['wrong']} wrong, "
        f"{summary['unexpected']} unexpected status); {summary['not_sent']} not sent (time limit)",
    ]
    if not summary["same_model"]:
        lines.append(f"note: the server's {summary['served']} is not the one in {summary['artifact']} (another "
                     "sha256): the answers were checked against the local folder all the same")
    lines += [f"  {p}" for p in summary["problems"]]
    return lines
