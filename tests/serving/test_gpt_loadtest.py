"""`mha loadtest --generate` on a real `mha serve` of gpt-mini on loopback (the session's GPT server, which
test_gpt_serve.py shares: conftest.py): a bounded mixed load
(streamed and whole answers, greedy and seeded sampling) passes with every answer checked; a local folder with
other weights is reported as wrong answers; a tampered stream or answer is caught; bad options are refused in
one line before any request is sent."""
from __future__ import annotations

import http.client
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from benchmarks.process import ServerProcess, free_port
from gpt_sources import book_model, save_book, vocab_dir
from mha_export.decoder.archs.gpt2.config import GPT_PRESETS
from mha_export.decoder.export import export_gpt
from mha_runtime.cli.main import cli
from mha_runtime.decoder.generate import Generator
from mha_runtime.serve.decoder import loadtest
from mha_runtime.serve.decoder.answers import GenOutcome, check_generations, reference_for
from mha_runtime.serve.decoder.loadtest import _send, generate_requests
from mha_runtime.serve.decoder.wire import GenerateRequest

MINI = GPT_PRESETS["gpt-mini"]
LOAD = ["--prompt-tokens", "1,7,32", "--max-new-tokens", "1,5,16"]


@pytest.fixture(scope="module")
def other_gpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpt-mini's config with other weights (the book's GPTModel, another seed): every answer of the served folder
    differs."""
    root = tmp_path_factory.mktemp("gpt-other")
    weights = save_book(book_model(MINI, seed=322), root / "ckpt")
    return export_gpt("other", root, config=MINI, weights=weights, tokenizer=vocab_dir(), variants=("inplace",)).folder


@pytest.fixture
def server(gpt_server: ServerProcess) -> ServerProcess:
    return gpt_server


def _loadtest(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["loadtest", *args])
    return result.exit_code, result.stdout, result.stderr


def test_mixed_generate_load_every_answer_right(server: ServerProcess, gpt_mini: Path, tmp_path: Path) -> None:
    """48 requests from 6 connections into 4 slots: prompts 1..32, 1..16 new tokens, half streamed, half
    sampled with a seed; all answered, all equal to the local generation."""
    folder, out = gpt_mini, tmp_path / "load.json"
    code, stdout, stderr = _loadtest(server.url, "--generate", "--artifact", str(folder), "--requests", "48",
                                     "--concurrency", "6", *LOAD, "--seed", "5", "--json", str(out))
    assert code == 0, stdout + stderr
    assert stdout.startswith("48 of 48 generate requests in ")
    assert "errors      0 (0 lost, 0 wrong, 0 unexpected status); 0 not sent (time limit)" in stdout
    assert "note:" not in stdout  # the local folder is the served one
    summary = json.loads(out.read_text())
    assert summary["answered"] == 48 and summary["errors"] == 0 and summary["same_model"] is True
    assert 0 < summary["streamed"] < 48 and 0 < summary["sampled"] < 48  # both kinds of each were sent
    made = generate_requests(Generator(folder).shapes, prompt_tokens=(1, 7, 32), max_new_tokens=(1, 5, 16), seed=5,
                             stream_share=0.5, sample_share=0.5)
    asked = sum(made(i).max_new_tokens for i in range(48))
    assert summary["new_tokens"] + summary["stops"].get("eos", 0) <= asked
    assert sum(summary["stops"].values()) == 48 and summary["new_tokens"] >= 48 - summary["stops"].get("eos", 0)
    assert summary["tokens_per_s"] == pytest.approx(summary["new_tokens"] / summary["seconds"])
    for figure in ("ttft_ms", "server_ttft_ms", "inter_token_ms"):
        p50, p90 = summary[figure]["p50"], summary[figure]["p90"]
        assert p50 is not None and 0 < p50 <= p90, (figure, summary[figure])
    assert re.search(r"ttft ms     p50 [0-9.]+ p90 [0-9.]+ \(client", stdout)
    rows = summary["first_token_ms"]  # [prompt tokens, client ms (streamed only), server ms] per answer
    assert sorted(row[0] for row in rows) == sorted(len(made(i).prompt_ids) for i in range(48))
    assert sum(row[1] is not None for row in rows) == summary["streamed"]
    # The client's span (send -> first token event) holds the replica's (arrival -> first token).
    assert all(row[2] > 0 and (row[1] is None or row[1] >= row[2]) for row in rows)


def test_a_load_cut_by_its_time_limit_makes_only_the_requests_it_sent(server: ServerProcess, gpt_mini: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """--requests 10**12 with --max-seconds 0.3: the summary made every request again to count the sampled ones
    (hours after the load); now only those sent."""
    real, made = loadtest.generate_requests, []

    def counting(*args: Any, **kwargs: Any) -> Callable[[int], GenerateRequest]:
        request = real(*args, **kwargs)

        def counted(i: int) -> GenerateRequest:
            made.append(i)
            assert len(made) < 100_000, "requests made far past those sent"
            return request(i)
        return counted

    monkeypatch.setattr(loadtest, "generate_requests", counting)
    code, stdout, stderr = _loadtest(server.url, "--generate", "--artifact", str(gpt_mini), "--requests",
                                     str(10**12), "--max-seconds", "0.3", "--concurrency", "1", *LOAD)
    sent = int(stdout.split(" of ")[0])
    assert code == 1 and f"load test failed: 0 error(s), {10**12 - sent} request(s) not sent" in stderr, stderr
    assert re.search(rf"; \d+ answered streamed, \d+ of {sent} sampled with a seed", stdout.splitlines()[0])


def test_other_weights_are_wrong_answers(server: ServerProcess, other_gpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    code, stdout, stderr = _loadtest(server.url, "--generate", "--artifact", str(other_gpt), "--requests", "12",
                                     "--concurrency", "3", *LOAD, "--json", str(out))
    summary = json.loads(out.read_text())
    assert code == 1 and "load test failed: 12 error(s)" in stderr, stdout + stderr
    assert summary["wrong"] == 12 and summary["lost"] == summary["unexpected"] == summary["answered"] == 0
    assert summary["same_model"] is False and "note: the server's gpt.inplace.onnx is not the one" in stdout
    assert "ids differ from the local generation" in stdout


def _answer(server: ServerProcess, request: GenerateRequest) -> GenOutcome:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        return _send(connection, 0, request)
    finally:
        connection.close()


def test_tampered_answers_are_caught(server: ServerProcess, gpt_mini: Path) -> None:
    """Real answers pass the check; the same answers with one id, the stop reason or the done event changed
    do not."""
    gen = Generator(gpt_mini)
    reference, decode = reference_for(gen), gen.tokenizer.decode if gen.tokenizer else None
    streamed = GenerateRequest([464, 318, 257], 6, 0.9, 40, 11, stream=True)
    whole = GenerateRequest([464, 318, 257], 6, stream=False)

    def judged(request: GenerateRequest, tamper: str) -> str | None:
        outcome = _answer(server, request)
        assert outcome.status == 200 and outcome.problem is None
        if tamper == "token id":
            at, raw = outcome.events[2]
            doc = json.loads(raw.decode().split("data: ", 1)[1])
            outcome.events[2] = (at, f"event: token\ndata: {json.dumps({**doc, 'id': doc['id'] + 1})}".encode())
        elif tamper == "no done":
            outcome.events.pop()
        elif tamper == "stop":
            outcome.body = json.dumps({**json.loads(outcome.body or b""), "stop": "eos"}).encode()
        check_generations([outcome], lambda _: request, reference, decode)
        return outcome.problem

    assert judged(streamed, "none") is None and judged(whole, "none") is None
    assert "token events' ids" in str(judged(streamed, "token id"))
    assert "expected token events then one done event" in str(judged(streamed, "no done"))
    assert "stop 'eos', expected 'max_new_tokens'" in str(judged(whole, "stop"))


def test_bad_options_are_one_line_before_any_request(server: ServerProcess, gpt_mini: Path) -> None:
    folder = str(gpt_mini)
    code, _, stderr = _loadtest(server.url, "--generate", "--artifact", folder, "--prompt-tokens", "250",
                                "--max-new-tokens", "16")
    assert code == 2 and stderr.count("\n") == 1
    assert "--prompt-tokens 250 + --max-new-tokens 16 = 266 runs past context_length 256" in stderr
    for args, says, status in (
        (["--prompt-tokens", "0"], "--prompt-tokens: expected counts >= 1", 2),
        (["--seed", "-1"], "--seed: expected an integer >= 0", 2),
        (["--tokens", "4"], "--tokens: not with --generate", 2),
        (["--stream", "1.5"], "'--stream'", 2),
    ):
        code, _, stderr = _loadtest(server.url, "--generate", "--artifact", folder, *args)
        assert code == status and says in stderr and stderr.count("\n") == 1, stderr
    code, _, stderr = _loadtest(server.url, "--artifact", folder, "--prompt-tokens", "4")
    assert code == 2 and "--prompt-tokens: only with --generate" in stderr
    code, _, stderr = _loadtest(server.url, "--artifact", folder)  # the attention load test on a GPT server
    assert code == 1 and "serves a GPT folder (gpt-mini): load test it with --generate" in stderr
    code, _, stderr = _loadtest("http://192.0.2.1:8000", "--generate", "--artifact", folder)
    assert code == 1 and "loopback only" in stderr
    code, _, stderr = _loadtest(f"http://127.0.0.1:{free_port()}", "--generate", "--artifact", folder)
    assert code == 1 and "no answer" in stderr  # nothing listens there


def test_gpt_serve_bench_judges_its_targets() -> None:
    """tokens/s c8 / c1 over all rounds' tokens and seconds; each request's TTFT over the solo prefill of its own
    prompt length, p50 per round, median of the c8 rounds; the whole mix's p50 over the median solo as information."""
    from benchmarks.gpt_serve_bench import judge

    def run(load: str, tokens: int, seconds: float, ttft: float, rows: list[list[float | None]],
            wrong: int = 0) -> dict[str, object]:
        return {"load": load, "new_tokens": tokens, "seconds": seconds, "ttft_ms": {"p50": ttft},
                "server_ttft_ms": {"p50": ttft / 2}, "errors": wrong, "not_sent": 0, "wrong": wrong,
                "first_token_ms": rows}  # [prompt tokens, client ms (streamed only), server ms]

    result = {"solo_prefill_ms": {"p50": 25.0, "p50_by_prompt_tokens": {"8": 10.0, "128": 40.0}},
              "runs": [run("c1", 100, 10.0, 12.0, [[8, 11.0, 10.0]]), run("c1", 100, 10.0, 14.0, [[128, 48.0, 40.0]]),
                       run("c8", 400, 10.0, 18.0, [[8, 15.0, 12.0], [128, 60.0, 50.0], [128, 70.0, 60.0]]),
                       run("c8", 200, 10.0, 30.0, [[8, 30.0, 20.0], [8, 18.0, 10.0], [128, 100.0, 90.0]], wrong=1),
                       run("c8", 300, 10.0, 19.0, [[128, 76.0, 60.0], [8, None, 5.0]])]}
    targets = {t["target"].split(" (")[0]: t for t in judge(result)}
    assert targets["new tokens/s, c8 over c1"]["value"] == pytest.approx(3.0)
    assert targets["new tokens/s, c8 over c1"]["met"] is True
    ttft = targets["time to first token at c8 over the solo prefill of the same prompt length"]
    assert ttft["value"] == pytest.approx(1.9) and ttft["met"] is True  # rounds 1.5, 2.5, 1.9
    mix = targets["time to first token p50 at c8 over the median solo prefill of all lengths"]
    assert mix["value"] == pytest.approx(19.0 / 25.0) and mix["met"] is None
    server = targets["server-reported time to first token at c8 over the solo prefill of the same prompt length"]
    assert server["value"] == pytest.approx(1.25)  # rounds 1.25, 2.0, 1.0 (the unstreamed row counts here)
    assert targets["time to first token at c1 over the solo prefill of the same prompt length"]["value"] == \
        pytest.approx(1.15)  # rounds 1.1, 1.2
    assert targets["wrong answers over the bench"]["met"] is False
    assert targets["errors"]["value"] == 1 and targets["errors"]["met"] is False
