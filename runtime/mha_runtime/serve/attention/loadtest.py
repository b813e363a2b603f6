"""`mha loadtest`: a bounded load on a loopback server, every answer checked against a local runner.

A load is `count` shots sent by `concurrency` threads (one keep-alive connection each) until all are sent or
`max_seconds` pass. A good shot's answer must equal the local runner's output on the same input within the
artifact's tolerance; it is checked once the load is over, so that the figures measure the server, not the
checking (the answers wait in memory, at most MAX_KEPT_BYTES). A bad shot (the tests interleave them) must get
its status and a one-line error.
"""
from __future__ import annotations

import http.client
import ipaddress
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from mha_runtime.artifact.errors import BadValueError, MHAError, ServeError, cut, first_line
from mha_runtime.artifact.manifest import DECODER_KIND, kind_named
from mha_runtime.artifact.tolerance import Tolerance, compare
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import spec_for
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.serve.attention.service import BATCH_REQUESTS, BATCH_TOKENS, CONTEXT
from mha_runtime.serve.attention.wire import JSON_VALUE_BYTES, decode_answer, encode_request
from mha_runtime.serve.http import CONTRACT
from mha_runtime.serve.load_runner import run_pool

REQUEST_TIMEOUT_S = 120.0
MAX_KEPT_BYTES = 2 * 2**30  # answers kept until the load is over and they are checked
FAILURES = ("lost", "wrong", "unexpected")  # a problem line starts with its kind and a colon (both load tests)


@dataclass(frozen=True)
class Shot:
    """One request and what must come back: for a good one (`x` given) the context of `x`; for a bad one the
    status `expect` and, when given, exactly the error line `error`."""

    body: bytes
    content_type: str
    x: np.ndarray | None = None
    expect: int = 200
    error: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    """What happened to shot `index`. `problem` is None when the answer was right; a good answer's body is kept
    (`answer`) until check_answers has judged it."""

    index: int
    status: int | None
    seconds: float
    good: bool
    length: int = 0  # the request's token count
    tokens: int = 0  # batch x length: the tokens it asked for
    problem: str | None = None
    batch_requests: int | None = None
    batch_tokens: int | None = None
    answer: tuple[bytes, str | None] | None = None


def loopback_target(url: str) -> tuple[str, int]:
    """'http://127.0.0.1:8000' -> ('127.0.0.1', 8000); anything that is not plain http to this machine is refused."""
    refusal = f"{url}: expected http://127.0.0.1:PORT (a load test targets this machine's loopback only)"
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
    except ValueError:  # an unclosed '[' of an IPv6 host
        raise ServeError(refusal) from None
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme != "http" or not loopback:
        raise ServeError(refusal)
    try:
        return host, 80 if parts.port is None else parts.port  # port 0 stays 0 (and gets no answer), not 80
    except ValueError as exc:
        raise ServeError(f"{url}: {first_line(exc)}") from None


def get_json(host: str, port: int, path: str, timeout: float = 10.0) -> dict[str, Any]:
    """GET a JSON object, or ServeError in one line: a port where something else listens (no HTTP, or no JSON
    object at `path`) is the user's wrong URL, not an internal error."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
    except OSError as exc:
        raise ServeError(f"http://{host}:{port}{path}: no answer ({first_line(exc)})") from None
    except http.client.HTTPException as exc:  # BadStatusLine: a server that speaks no HTTP (ssh, Ray's own ports)
        raise ServeError(f"http://{host}:{port}{path}: not an HTTP answer ({type(exc).__name__}: "
                         f"{cut(first_line(exc), 80)}); is `mha serve` listening there?") from None
    finally:
        connection.close()
    if response.status != 200:
        raise ServeError(f"http://{host}:{port}{path}: status {response.status}")
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError):  # JSONDecodeError is a ValueError
        doc = None
    if not isinstance(doc, dict):
        raise ServeError(f"http://{host}:{port}{path}: expected a JSON object, got {cut(repr(body), 60)}; is "
                         "`mha serve` listening there?")
    return doc


def good_shots(config: MHAConfig, *, tokens: Sequence[int], batches: Sequence[int], fmt: str,
               seed: int) -> Callable[[int], Shot]:
    """Shot i: random normal input with tokens and batch drawn from the lists, the same for a given (seed, i)
    whichever thread sends it (check_answers makes it again)."""
    def shot(i: int) -> Shot:
        rng = np.random.default_rng([seed, i])
        shape = (int(rng.choice(batches)), int(rng.choice(tokens)), config.d_in)
        x = rng.standard_normal(shape, dtype=np.float32)
        body, content_type = encode_request(x, fmt)
        return Shot(body, content_type, x=x)
    return shot


def _refusal_problem(shot: Shot, status: int, body: bytes) -> str | None:
    """None if a bad shot got its status and a one-line JSON error (the expected line, when given)."""
    if status != shot.expect:
        return f"unexpected: status {status}, expected {shot.expect} ({body[:120]!r})"
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return f"unexpected: status {status} without a JSON error body ({body[:120]!r})"
    if not isinstance(error, str) or "\n" in error or (shot.error is not None and error != shot.error):
        return f"unexpected: error {error!r}, expected {shot.error or 'one line'!r}"
    return None


def _send(connection: http.client.HTTPConnection, index: int, shot: Shot) -> Outcome:
    """One request on a kept-alive connection; an exception (no answer) is left to the caller."""
    sent = time.perf_counter()
    connection.request("POST", CONTEXT, body=shot.body, headers={"Content-Type": shot.content_type, **shot.headers})
    response = connection.getresponse()
    body = response.read()
    seconds = time.perf_counter() - sent
    requests, tokens = response.getheader(BATCH_REQUESTS), response.getheader(BATCH_TOKENS)
    outcome = Outcome(index, response.status, seconds, shot.x is not None,
                      batch_requests=int(requests) if requests else None,
                      batch_tokens=int(tokens) if tokens else None)
    if shot.x is None:
        outcome.problem = _refusal_problem(shot, response.status, body)
    elif response.status != 200:
        outcome.problem = f"unexpected: status {response.status} for a good request ({body[:160]!r})"
    else:
        outcome.length = shot.x.shape[1]
        outcome.tokens = shot.x.shape[0] * shot.x.shape[1]
        outcome.answer = (body, response.getheader("content-type"))
    return outcome


def run_load(url: str, shots: Callable[[int], Shot], *, count: int, concurrency: int, max_seconds: float,
             timeout_s: float = REQUEST_TIMEOUT_S) -> tuple[list[Outcome], float]:
    """Send shots 0..count-1 from `concurrency` threads, one kept-alive connection each; return every outcome
    (in completion order) and the wall time. No new shot starts after `max_seconds`. Refusals are judged here,
    good answers are kept for check_answers, so that checking takes no CPU from the server during the load."""
    host, port = loopback_target(url)
    return run_pool(host, port, shots, send=_send, count=count, concurrency=concurrency, max_seconds=max_seconds,
                    timeout_s=timeout_s, reconnect=lambda outcome: outcome.status != 200,  # after a refusal
                    lost=lambda i, shot, seconds, why: Outcome(i, None, seconds, shot.x is not None,
                                                               problem=f"lost: {why}"))


def check_answers(outcomes: list[Outcome], shots: Callable[[int], Shot],
                  reference: Callable[[np.ndarray], np.ndarray], tolerance: Tolerance) -> None:
    """Judge every kept answer against `reference` on the same input (the shot made again); frees the bodies."""
    for outcome in outcomes:
        if outcome.answer is None:
            continue
        (body, content_type), outcome.answer = outcome.answer, None
        x = shots(outcome.index).x
        assert x is not None  # only good shots keep an answer
        try:
            answer = decode_answer(body, content_type)
        except MHAError as exc:
            outcome.problem = f"wrong: {exc}"
            continue
        result = compare(answer, reference(x), tolerance)
        if not result.ok:
            outcome.problem = (f"wrong: shot {outcome.index}: shape {list(answer.shape)} for input {list(x.shape)}, "
                               f"max abs diff {result.max_abs:.3g}")


def percentiles_ms(seconds: Sequence[float], qs: Sequence[tuple[str, float]]) -> dict[str, float | None]:
    """{name: the q-th percentile in ms} of a list of seconds (None for each when the list is empty)."""
    data = np.array(seconds, dtype=np.float64) * 1e3
    return {name: float(np.percentile(data, q)) if data.size else None for name, q in qs}


def ms_text(figures: dict[str, float | None], keys: Sequence[str]) -> str:
    """'p50 1.2 p90 3.4' ('-' for a figure that is None)."""
    return " ".join(f"{k} {'-' if figures[k] is None else f'{figures[k]:.1f}'}" for k in keys)


def summarize(outcomes: list[Outcome], seconds: float, *, count: int) -> dict[str, Any]:
    """Throughput, latency percentiles of the good requests, and every kind of failure counted."""
    good = [o for o in outcomes if o.good and o.problem is None]
    kinds = {kind: sum(1 for o in outcomes if o.problem and o.problem.startswith(kind + ":")) for kind in FAILURES}
    batched = [o for o in good if o.batch_requests is not None]
    return {
        "requests": count, "sent": len(outcomes), "not_sent": count - len(outcomes), "seconds": seconds,
        "answered": len(good), "refused_as_expected": sum(1 for o in outcomes if not o.good and o.problem is None),
        "requests_per_s": len(good) / seconds if seconds else 0.0,
        "tokens_per_s": sum(o.tokens for o in good) / seconds if seconds else 0.0,
        "latency_ms": percentiles_ms([o.seconds for o in good], (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))),
        "errors": sum(kinds.values()), **kinds,
        "batches": {"mean_requests": float(np.mean([o.batch_requests for o in batched])) if batched else None,
                    "max_requests": max((o.batch_requests or 0 for o in batched), default=None),
                    "padded": sum(1 for o in batched if (o.batch_tokens or 0) > o.length)},
        "problems": [o.problem for o in outcomes if o.problem][:10],
    }


def loadtest(url: str, artifact: Path, *, requests: int, concurrency: int, tokens: Sequence[int],
             batches: Sequence[int] = (1,), fmt: str = "npy", seed: int = 0, max_seconds: float = 300.0,
             threads: int | None = None) -> dict[str, Any]:
    """The load `mha loadtest` sends: good requests only, every answer checked after the load against a runner
    on the local copy of the served model (refused unless its sha256 is the server's)."""
    host, port = loopback_target(url)
    info = get_json(host, port, CONTRACT)
    if kind_named(info.get("kind")) == DECODER_KIND:
        raise ServeError(f"{url} serves a GPT folder ({info.get('name')}): load test it with --generate")
    model = info.get("model")
    manifest = load_manifest(artifact)
    if model not in manifest.files or manifest.files[model].sha256 != info.get("sha256"):
        raise ServeError(f"{url} serves {model} sha256 {str(info.get('sha256'))[:12]}..., which is not in "
                         f"{artifact}: load test against the artifact folder the server was started with")
    runner = OnnxRunner(artifact, model=model, provider="cpu", threads=threads)
    config = runner.config
    if not tokens or not all(1 <= t <= config.context_length for t in tokens):
        raise BadValueError(f"--tokens: expected counts in 1..{config.context_length} (context_length), "
                           f"got {list(tokens)}")
    if not batches or min(batches) < 1:
        raise BadValueError(f"--batch: expected sizes >= 1, got {list(batches)}")
    most = info.get("max_batch")
    if isinstance(most, int) and max(batches) > most:  # every such request would be a 413, counted as a failure
        raise BadValueError(f"--batch: expected sizes in 1..{most} (the server's --max-batch), got {list(batches)}")
    kept = requests * max(batches) * max(tokens) * config.d_model * (4 if fmt == "npy" else JSON_VALUE_BYTES)
    if kept > MAX_KEPT_BYTES:
        raise BadValueError(f"--requests {requests}: the answers kept for checking could reach {kept / 2**30:.1f} GiB "
                           f"(limit {MAX_KEPT_BYTES / 2**30:.0f} GiB); send fewer requests, or fewer tokens")
    record = manifest.artifacts.get(model)
    tolerance = record.tolerance if record is not None else spec_for(model).tolerance
    shots = good_shots(config, tokens=tokens, batches=batches, fmt=fmt, seed=seed)
    outcomes, seconds = run_load(url, shots, count=requests, concurrency=concurrency, max_seconds=max_seconds)
    check_answers(outcomes, shots, runner.run, tolerance)
    summary = summarize(outcomes, seconds, count=requests)
    summary.update(url=url, model=model, concurrency=concurrency, tokens=list(tokens), batch=list(batches),
                   format=fmt, seed=seed, max_seconds=max_seconds)
    return summary


def report_lines(summary: dict[str, Any]) -> list[str]:
    """The load test's printout: what was sent, throughput, latency, failures."""
    batches = summary["batches"]
    lines = [
        f"{summary['sent']} of {summary['requests']} requests in {summary['seconds']:.1f} s, concurrency "
        f"{summary['concurrency']}, tokens {','.join(map(str, summary['tokens']))}, batch "
        f"{','.join(map(str, summary['batch']))}, {summary['format']}",
        f"throughput  {summary['requests_per_s']:.1f} requests/s, {summary['tokens_per_s']:.0f} tokens/s",
        f"latency ms  {ms_text(summary['latency_ms'], ('p50', 'p90', 'p99'))}",
    ]
    if batches["mean_requests"] is not None:
        lines.append(f"batches     {batches['mean_requests']:.2f} requests on average, at most "
                     f"{batches['max_requests']}; {batches['padded']} answers came from a padded batch")
    lines.append(f"errors      {summary['errors']} ({summary['lost']} lost, {summary['wrong']} wrong, "
                 f"{summary['unexpected']} unexpected status); {summary['not_sent']} not sent (time limit)")
    lines += [f"  {p}" for p in summary["problems"]]
    return lines
