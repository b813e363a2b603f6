"""`mha serve` and `mha loadtest`: the wire format, exact padded batching, the HTTP service without a server, and
one real Ray Serve server on loopback under a bounded mixed load (the servers a test starts and stops itself:
test_serve_lifecycle.py)."""
from __future__ import annotations

import asyncio
import http.client
import io
import json
import re
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from benchmarks.process import ServerProcess, free_port
from mha_runtime.artifact.errors import ContractError, RequestError, ServeError
from mha_runtime.attention.config import PRESETS, MHAConfig
from mha_runtime.attention.contract import check_input
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.npy import npy_bytes
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.cli.main import cli
from mha_runtime.cli.options import MAX_BATCH_WAIT_MS
from mha_runtime.serve.attention.batching import length_groups, pad_batch, run_grouped, run_padded, work
from mha_runtime.serve.attention.loadtest import Shot, check_answers, good_shots, loopback_target, run_load, summarize
from mha_runtime.serve.attention.service import Answer, ContextService
from mha_runtime.serve.attention.wire import (
    NPY,
    NPY_MAGIC,
    body_limit,
    decode_answer,
    decode_request,
    encode_answer,
    encode_request,
)
from mha_runtime.serve.http import BODY_IDLE_S, Reply
from mha_runtime.serve.launcher import DRAIN_TIMEOUT_S
from mha_runtime.serve.options import ServeOptions

SEED = MHAConfig(d_in=3, d_out=2, num_heads=2, context_length=6)


# ---- the wire format ------------------------------------------------------------------------------------------

def test_requests_and_answers_round_trip_in_both_formats() -> None:
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)
    for fmt in ("npy", "json"):
        body, content_type = encode_request(x, fmt)
        array, answer_fmt = decode_request(body, content_type)
        assert answer_fmt == fmt and np.array_equal(check_input(array, SEED), x)
        assert np.array_equal(decode_answer(*encode_answer(x, fmt)), x)
    big_endian = npy_bytes(x.astype(">f4"))
    assert np.array_equal(check_input(decode_request(big_endian, NPY)[0], SEED), x)  # made native, then accepted


@pytest.mark.parametrize(("body", "content_type", "says"), [
    (b'{"x": [[[1, 2', "application/json", "expected JSON"),
    (b'{"y": 1}', "application/json", 'expected a JSON object {"x"'),
    (b'[1, 2]', "application/json", 'expected a JSON object {"x"'),
    (b'{"x": [[[1, 2, 3]], [[1, 2]]]}', "application/json", "rectangular"),
    (b'{"x": [[["1", "2", "3"]]]}', "application/json", "expected numbers"),
    (b'{"x": [[[true, false, true]]]}', "application/json", "expected numbers"),
    # beside numbers numpy read them as 1 and 0: answered as if the client had sent numbers
    (b'{"x": [[[true, 2, 3]]]}', "application/json", "expected numbers, got true or false among them"),
    (b'{"x": [[[1.5, 2, 3]], [[1, 2, false]]]}', "application/json", "expected numbers, got true or false"),
    (b"[" * 100_000, "application/json", "expected JSON"),
    (b'{"x": [[[1, 2, 3]]], "x": [[[4, 5, 6]]]}', "application/json", "expected unique member names, got 'x' twice"),
    (b'{"x": [[[1' + b"0" * 5000 + b"]]]}", "application/json", "expected JSON integers of at most 4300 digits"),
    (b"garbage", NPY, "no \\x93NUMPY magic"),
    (npy_bytes(np.zeros((1, 2, 3), np.float32))[:-4], NPY, "the body holds"),
    (npy_bytes(np.zeros((1, 2, 3), np.float32)).replace(b"(1, 2, 3)", b"(9, 9, 9)"), NPY, "the body holds"),
    (b"x=1", "text/plain", "Content-Type: expected"),
    # a header length that cuts the header short: numpy's tokenizer raised TokenError, a 500
    (b"\x93NUMPY\x01\x00" + (30).to_bytes(2, "little") + b"{'descr': '<f4', 'fortran_order': False, 'shape': "
     b"(1, 1, 3), }\n" + b"\0" * 12, NPY, "expected a .npy file"),
])
def test_malformed_bodies_are_refused_in_one_line(body: bytes, content_type: str, says: str) -> None:
    with pytest.raises(RequestError) as info:
        decode_request(body, content_type)
    assert info.value.status == 400 and says in str(info.value) and "\n" not in str(info.value)


def test_pickled_npy_is_refused() -> None:
    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(stream, {"descr": "|O", "fortran_order": False, "shape": (1,)})
    with pytest.raises(RequestError, match="pickled objects refused"):
        decode_request(stream.getvalue() + b"\0" * 8, NPY)


@pytest.mark.parametrize(("shape", "body_bytes", "says"), [
    ((-1, -2, 3), 24, "a dimension below 0"),  # the product, 6 values, matched the body: reshape raised (a 500)
    ((2**32, 2**32, 3), 0, "bytes), the body holds 0"),  # the int64 product wrapped round to 0 bytes
    ((2**63, 2, 3), 0, "bytes), the body holds 0"),
    ((0, 2**70, 3), 0, "is not one numpy can hold"),  # no bytes, as the header says, but past numpy's limit
])
def test_npy_headers_with_impossible_shapes_are_refused(shape: tuple[int, ...], body_bytes: int, says: str) -> None:
    stream = io.BytesIO()
    np.lib.format.write_array_header_1_0(stream, {"descr": "<f4", "fortran_order": False, "shape": shape})
    with pytest.raises(RequestError) as info:
        decode_request(stream.getvalue() + b"\0" * body_bytes, NPY)
    assert info.value.status == 400 and says in str(info.value) and "\n" not in str(info.value)


def test_body_limit_follows_the_config_max_batch_and_format() -> None:
    assert body_limit(SEED, 1, "json") == 4096 + 6 * 3 * 32
    assert body_limit(SEED, 1, "npy") == 4096 + 6 * 3 * 4  # float32
    for fmt in ("json", "npy"):
        assert body_limit(SEED, 8, fmt) - 4096 == 8 * (body_limit(SEED, 1, fmt) - 4096)
    full = npy_bytes(np.zeros((8, 6, 3), np.float32))  # the largest input a --max-batch 8 server takes
    assert len(full) <= body_limit(SEED, 8, "npy") < len(full) + 4096
    assert len(json.dumps({"x": np.full((8, 6, 3), -0.12345678901234567).tolist()})) <= body_limit(SEED, 8, "json")


# ---- exact padded batching ------------------------------------------------------------------------------------

@pytest.mark.parametrize("lengths", [(1, 6), (6, 1, 3), (2, 2, 5, 1, 6, 4), (1,), (6, 6)])
def test_padded_batch_answers_equal_single_request_answers(seed_dir: Path, lengths: tuple[int, ...]) -> None:
    """Causal attention makes right-padding exact: position t never sees a later one."""
    runner = OnnxRunner(seed_dir, provider="cpu", threads=1)
    rng = np.random.default_rng(len(lengths))
    xs = [rng.standard_normal((1 + i % 3, t, 3)).astype(np.float32) for i, t in enumerate(lengths)]  # batch 1..3
    padded = pad_batch(xs)
    assert padded.shape == (sum(x.shape[0] for x in xs), max(lengths), 3)
    for x, answer in zip(xs, run_padded(runner.run, xs), strict=True):
        alone = runner.run(x)
        assert answer.shape == alone.shape
        np.testing.assert_allclose(answer, alone, rtol=0, atol=1e-6)


def test_padded_batching_is_exact_on_a_wider_model(mid_dir: Path) -> None:
    """Mixed lengths 1..context_length (48) of the mid-size config, with q/k/v biases, several heads."""
    runner = OnnxRunner(mid_dir, provider="cpu", threads=1)
    rng = np.random.default_rng(7)
    lengths = [1, 48, 17, 2, 47, 1, 30, 48]
    xs = [rng.standard_normal((1 if i % 2 else 3, t, 64)).astype(np.float32) for i, t in enumerate(lengths)]
    worst = max(float(np.abs(a - runner.run(x)).max()) for x, a in zip(xs, run_padded(runner.run, xs), strict=True))
    assert worst <= 1e-6, worst
    grouped = run_grouped(runner.run, xs, work(runner.config))  # what a replica runs: padded per length group
    assert all(np.abs(a - runner.run(x)).max() <= 1e-6 for x, (a, _, _) in zip(xs, grouped, strict=True))
    assert [(size, tokens) for _, size, tokens in grouped][:2] == [(8, 48), (8, 48)]  # mid is small: one call


def test_one_overflowing_request_is_refused_alone_not_its_batch(seed_dir: Path) -> None:
    """A finite input of 1e30 overflows float32 attention scores into NaN: only that request is refused; the
    others padded into the same call still get their own answers (before, the whole batch got its refusal)."""
    runner = OnnxRunner(seed_dir, provider="cpu", threads=1)
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, t, 3)).astype(np.float32) for t in (2, 3, 2)]
    xs.insert(1, np.full((1, 2, 3), 1e30, np.float32))
    grouped = run_grouped(runner.run, xs, work(runner.config))
    assert [size for _, size, _ in grouped] == [4] * 4  # the seed is tiny: one padded call for all four
    assert isinstance(grouped[1][0], ContractError) and "NaN/inf value(s)" in str(grouped[1][0])
    for i in (0, 2, 3):
        np.testing.assert_allclose(grouped[i][0], runner.run(xs[i]), rtol=0, atol=1e-6)
    with pytest.raises(ContractError, match="NaN/inf value"):  # alone, the refusal is raised
        run_padded(runner.run, [xs[1]])


def test_length_groups_pad_only_where_padding_costs_less_than_a_call() -> None:
    def requests(*lengths: int) -> list[np.ndarray]:
        return [np.zeros((1, t, 1), np.float32) for t in lengths]

    gpt2 = work(PRESETS["gpt2-small"])  # a 16-token row padded to 64 costs 4x its own work: kept apart
    assert length_groups(requests(16, 64, 16, 64, 63, 1), gpt2) == [[5], [0, 2], [4, 1, 3]]
    assert length_groups(requests(6, 1, 3, 2), work(SEED)) == [[1, 3, 2, 0]]  # the toy model: one call for all


# ---- the HTTP service without a server ------------------------------------------------------------------------

async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def _service(infer_error: Exception | None = None, max_batch: int = 1) -> ContextService:
    async def infer(x: np.ndarray) -> Answer:
        if infer_error is not None:
            raise infer_error
        return Answer(x[..., :1].repeat(4, axis=-1), 1, x.shape[1])
    return ContextService(config=SEED, info={"name": "seed"}, max_batch=max_batch, infer=infer)


def _handle(service: ContextService, method: str, path: str, body: bytes = b"",
            headers: dict[str, str] | None = None) -> Reply:
    heads = {"content-type": "application/json", "content-length": str(len(body))} | (headers or {})
    return asyncio.run(service.handle(method, path, heads, _chunks(body)))


def _error(reply: Reply) -> str:
    message = json.loads(reply.body)["error"]
    assert isinstance(message, str) and "\n" not in message
    return message


def test_service_routes_and_status_codes() -> None:
    service = _service()
    assert _handle(service, "GET", "/v1/health").status == 200
    assert json.loads(_handle(service, "GET", "/v1/contract/").body) == {"name": "seed"}
    missing = _handle(service, "GET", "/nope")
    assert missing.status == 404 and "no route /nope" in _error(missing)
    assert _handle(service, "GET", "/v1/context").status == 405
    assert _handle(service, "HEAD", "/v1/health").status == 200
    assert _handle(service, "HEAD", "/v1/context").status == 405
    ok = _handle(service, "POST", "/v1/context", json.dumps({"x": [[[1, 2, 3]]]}).encode())
    assert ok.status == 200 and json.loads(ok.body) == {"context": [[[1.0, 1.0, 1.0, 1.0]]]}


def test_service_contract_violation_is_400_with_the_runners_line() -> None:
    x = np.zeros((1, 7, 3))
    with pytest.raises(ContractError) as expected:
        check_input(x, SEED)
    reply = _handle(_service(), "POST", "/v1/context", json.dumps({"x": x.tolist()}).encode())
    assert reply.status == 400 and _error(reply) == str(expected.value)


def test_service_body_limit_is_413_declared_or_streamed() -> None:
    limit = body_limit(SEED, 1, "json")
    declared = _handle(_service(), "POST", "/v1/context", b"", {"content-length": str(limit + 1)})
    assert declared.status == 413 and "over the limit" in _error(declared)
    service = _service()
    streamed = asyncio.run(service.handle("POST", "/v1/context", {"content-type": "application/json"},
                                          _chunks(*[b" " * 1024] * 20)))  # chunked: no Content-Length
    assert streamed.status == 413


def _good(service: ContextService) -> None:
    """A good request on `service` is answered: a refusal leaves nothing behind."""
    ok = _handle(service, "POST", "/v1/context", b'{"x": [[[1, 2, 3]]]}')
    assert ok.status == 200 and json.loads(ok.body) == {"context": [[[1.0, 1.0, 1.0, 1.0]]]}


def test_service_refuses_a_batch_over_max_batch_with_413() -> None:
    service = _service(max_batch=2)
    for fmt in ("json", "npy"):
        body, content_type = encode_request(np.zeros((3, 2, 3), np.float32), fmt)
        reply = _handle(service, "POST", "/v1/context", body, {"content-type": content_type})
        assert reply.status == 413, fmt
        assert _error(reply) == ("input 'x': batch 3 is over this server's max batch 2 (--max-batch); "
                                 "send at most 2 per request")
        _good(service)
    body, content_type = encode_request(np.zeros((2, 6, 3), np.float32), "npy")  # a full batch at the limit
    assert _handle(service, "POST", "/v1/context", body, {"content-type": content_type}).status == 200


def test_service_body_limit_is_per_format() -> None:
    """max batch 1 on the seed config: JSON 4096 + 18 * 32 = 4672 bytes, .npy 4096 + 18 * 4 = 4168 bytes; an
    .npy body over its limit is refused from Content-Length and while streaming, before any parsing."""
    service = _service()
    npy_limit, json_limit = body_limit(SEED, 1, "npy"), body_limit(SEED, 1, "json")
    assert (npy_limit, json_limit) == (4168, 4672)
    over = NPY_MAGIC + b"\0" * (npy_limit + 1 - len(NPY_MAGIC))  # no valid header: parsing it would be a 400
    declared = _handle(service, "POST", "/v1/context", over, {"content-type": NPY})
    assert declared.status == 413
    assert _error(declared) == ("body of 4169 bytes is over the limit of 4168 bytes (max batch 1 x context_length 6 "
                                "x d_in 3 values at 4 bytes each as npy, plus 4096)")
    streamed = asyncio.run(service.handle("POST", "/v1/context", {"content-type": NPY},
                                          _chunks(over[:4000], over[4000:])))  # chunked: no Content-Length
    assert streamed.status == 413 and _error(streamed) == ("body is over the limit of 4168 bytes (max batch 1 x "
                                                           "context_length 6 x d_in 3 values at 4 bytes each as "
                                                           "npy, plus 4096)")
    at_limit = _handle(service, "POST", "/v1/context", over[:-1], {"content-type": NPY})
    assert at_limit.status == 400 and "expected a .npy file" in _error(at_limit)  # within the limit: parsed
    _good(service)
    padded = b'{"x": [[[1, 2, 3]]]}'.ljust(npy_limit + 1)  # over the .npy limit, within JSON's: answered
    assert _handle(service, "POST", "/v1/context", padded).status == 200
    too_long = _handle(service, "POST", "/v1/context", b'{"x": [[[1, 2, 3]]]}'.ljust(json_limit + 1))
    assert too_long.status == 413 and "at 32 bytes each as json" in _error(too_long)
    other = _handle(service, "POST", "/v1/context", b"x=1", {"content-type": "text/plain"})
    assert other.status == 400 and _error(other) == ("Content-Type: expected application/json or "
                                                     "application/x-npy, got 'text/plain'")


def test_service_refuses_unknown_json_keys() -> None:
    service = _service()
    for body, names in ((b'{"x": [[[1, 2, 3]]], "y": 1}', "key 'y'"),
                        (b'{"y": 1, "x": [[[1, 2, 3]]], "batch": 2}', "keys 'batch', 'y'"),
                        (b'{"y": 1}', "key 'y'")):
        reply = _handle(service, "POST", "/v1/context", body)
        assert reply.status == 400
        assert _error(reply) == f'body: expected a JSON object {{"x": [[[...]]]}}, got unknown {names}'
        _good(service)
    many = json.dumps({"x": [[[1, 2, 3]]]} | {f"k{i}": i for i in range(7)} | {"z" * 50: 0}).encode()
    reply = _handle(service, "POST", "/v1/context", many)
    assert reply.status == 400 and _error(reply).endswith("got unknown keys 'k0', 'k1', 'k2', 'k3', 'k4' and 3 more")


def test_service_refuses_npy_with_bytes_after_the_array() -> None:
    """The seeded bug: without read_npy's byte-count check, np.frombuffer(count=...) would read the array and
    silently drop what follows it."""
    service = _service()
    body = npy_bytes(np.ones((1, 2, 3), np.float32)) + b"\0" * 4
    reply = _handle(service, "POST", "/v1/context", body, {"content-type": NPY})
    assert reply.status == 400
    assert _error(reply) == "body: the .npy header says shape [1, 2, 3] float32 (24 bytes), the body holds 28"
    exact = _handle(service, "POST", "/v1/context", body[:-4], {"content-type": NPY})
    assert exact.status == 200 and np.array_equal(decode_answer(exact.body, exact.content_type), np.ones((1, 2, 4)))


def test_service_internal_failure_is_500_in_one_line() -> None:
    reply = _handle(_service(RuntimeError("boom\nsecond line")), "POST", "/v1/context", b'{"x": [[[1, 2, 3]]]}')
    assert reply.status == 500 and _error(reply) == "internal error: RuntimeError: boom"


def test_loadtest_targets_loopback_only() -> None:
    assert loopback_target("http://127.0.0.1:8000") == ("127.0.0.1", 8000)
    assert loopback_target("localhost:9") == ("localhost", 9)
    # the URL `mha serve --host ::1` prints (it was http://::1:8000, refused here as not loopback)
    assert loopback_target(ServeOptions(artifact=Path("x"), host="::1").url) == ("::1", 8000)
    assert ServeOptions(artifact=Path("x")).url == "http://127.0.0.1:8000"
    for url in ("http://example.com:8000", "https://127.0.0.1:8000", "http://10.0.0.1:8000"):
        with pytest.raises(ServeError, match="loopback"):
            loopback_target(url)


@pytest.mark.parametrize(("answer", "says"), [
    (b"SSH-2.0-OpenSSH_9.6\r\n", "not an HTTP answer (BadStatusLine: SSH-2.0-OpenSSH_9.6"),  # was an internal error
    (b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n<html></html>", "expected a JSON object, got b'<html></html>'"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\n[1, 2]", "expected a JSON object, got b'[1, 2]'"),
])
@pytest.mark.parametrize("generate", [False, True])
def test_loadtest_of_a_port_where_no_mha_server_listens_is_one_line(tmp_path: Path, answer: bytes, says: str,
                                                                     generate: bool) -> None:
    """Another server on the port (a wrong URL) was an internal error: BadStatusLine, JSONDecodeError, a list's
    missing .get. The server is asked before the folder is read, so any folder does."""
    with answering_port(answer) as port:
        args = ["loadtest", f"http://127.0.0.1:{port}", "--artifact", str(tmp_path)]
        result = CliRunner().invoke(cli, [*args, "--generate"] if generate else args)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert f"Error: http://127.0.0.1:{port}/v1/contract: {says}" in result.stderr, result.stderr


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pydantic's, from ray's import
def test_serve_refuses_before_starting_ray(seed_dir: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["serve", str(tmp_path / "none")])
    assert result.exit_code == 1 and "found none" in result.stderr and result.stderr.count("\n") == 1
    result = CliRunner().invoke(cli, ["serve", str(seed_dir), "--model", "mha.decode.onnx"])
    assert result.exit_code == 1 and "cannot serve it" in result.stderr and "Traceback" not in result.output
    with listening_port() as port:
        result = CliRunner().invoke(cli, ["serve", str(seed_dir), "--port", str(port)])
    assert result.exit_code == 1 and f"--port {port}: cannot listen" in result.stderr
    with listening_port() as port:  # an empty --model served the default model (here: the port's line came)
        result = CliRunner().invoke(cli, ["serve", str(seed_dir), "--model", "", "--port", str(port)])
    assert result.exit_code == 1 and "model: expected a file name such as 'mha.onnx', got ''" in result.stderr
    closed = free_port()  # nothing listens there: ray.init would retry it for minutes
    for address in (f"127.0.0.1:{closed}", f"ray://127.0.0.1:{closed}"):
        result = CliRunner().invoke(cli, ["serve", str(seed_dir), "--address", address])
        assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
        assert f"--address {address}: cannot reach a Ray cluster there (Connection refused)" in result.stderr


def test_the_batch_wait_bound_is_the_drain_timeout() -> None:
    """Declared twice (the CLI does not load the launcher): a longer wait would be cut by SIGTERM's drain."""
    assert MAX_BATCH_WAIT_MS == DRAIN_TIMEOUT_S * 1000


@contextmanager
def listening_port() -> Iterator[int]:
    """A loopback port held open, as another server would."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@contextmanager
def answering_port(answer: bytes) -> Iterator[int]:
    """A loopback port whose server reads one request and sends `answer`, whatever was asked."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()

        def reply() -> None:
            connection, _ = sock.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(answer)

        thread = threading.Thread(target=reply, daemon=True)
        thread.start()
        yield int(sock.getsockname()[1])
        thread.join(10)


# ---- a real server --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(seed_dir: Path, ray_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(seed_dir, tmp_path_factory.mktemp("server-log"), "--max-batch", "8",
                            "--batch-wait-ms", "20", home=ray_home)
    with process:
        yield process
    assert process.returncode == 0, process.stderr()
    assert process.leftovers == [], "Ray processes outlived the server"


def _get(server: ServerProcess, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_server_health_and_contract(server: ServerProcess, seed_dir: Path) -> None:
    assert _get(server, "/v1/health") == (200, b'{"status": "ok"}')
    status, body = _get(server, "/v1/contract")
    info, manifest = json.loads(body), load_manifest(seed_dir)
    assert status == 200 and info["name"] == "seed" and info["model"] == "mha.onnx"
    assert info["sha256"] == manifest.files["mha.onnx"].sha256 and info["config"] == manifest.config.to_dict()
    assert info["contract"] == manifest.contract and info["max_batch"] == 8
    assert info["body_limit_bytes"] == {"npy": body_limit(manifest.config, 8, "npy"),
                                        "json": body_limit(manifest.config, 8, "json")}
    assert _get(server, "/v1/nope")[0] == 404 and _get(server, "/v1/context")[0] == 405
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:  # a HEAD is a GET's headers alone (it was a 405): what a load balancer's health probe may send
        connection.request("HEAD", "/v1/health")
        response = connection.getresponse()
        assert (response.status, response.read(), response.getheader("content-length")) == (200, b"", "16")
    finally:
        connection.close()
    assert server.stdout().startswith(f"serving seed (mha.onnx) at {server.url}/v1/context")


def _bad_shots(config: MHAConfig, limit: int) -> list[Shot]:
    """Malformed and contract-breaking requests, each with its status and, for a contract violation, the
    runner's own line."""
    def contract(x: np.ndarray, fmt: str) -> Shot:
        with pytest.raises(ContractError) as expected:
            check_input(x, config)
        body, content_type = (npy_bytes(x), NPY) if fmt == "npy" else (
            json.dumps({"x": x.tolist()}).encode(), "application/json")
        return Shot(body, content_type, expect=400, error=str(expected.value))

    width, ctx = config.d_in, config.context_length
    return [
        contract(np.ones((1, ctx + 1, width), np.float32), "npy"),  # tokens > context_length
        Shot(b'{"x": [[[1, 2', "application/json", expect=400),  # malformed JSON
        contract(np.ones((2, 3, width + 1)), "json"),  # wrong d_in
        Shot(b"not an npy file", NPY, expect=400),
        contract(np.full((1, 2, width), np.nan, np.float32), "npy"),  # NaN
        contract(np.ones((3, width)), "json"),  # rank 2
        contract(np.ones((1, 2, width), np.int32), "npy"),  # integer dtype
        Shot(b'{"x": [[[true, false, true]]]}', "application/json", expect=400),
        Shot(b'{"x": [[[true, 2, 3]]]}', "application/json", expect=400,  # was a 200, true read as 1
             error="'x': expected numbers, got true or false among them"),
        Shot(b" " * (limit + 1), "application/json", expect=413),  # over the body limit
        Shot(npy_bytes(np.ones((9, 1, width), np.float32)), NPY, expect=413,  # the server runs --max-batch 8
             error="input 'x': batch 9 is over this server's max batch 8 (--max-batch); send at most 8 per request"),
        Shot(b'{"x": [[[1, 2, 3]]], "y": 1}', "application/json", expect=400,
             error='body: expected a JSON object {"x": [[[...]]]}, got unknown key \'y\''),
        Shot(b"x=1", "text/plain", expect=400),
    ]


def test_mixed_load_every_answer_right_every_refusal_one_line(server: ServerProcess, seed_dir: Path) -> None:
    """240 requests from 8 connections: tokens 1..6, batch 1 and 3, npy and JSON, with a malformed or
    contract-breaking request every fifth; nothing lost, nothing wrong, every refusal its status and line."""
    config = load_manifest(seed_dir).config
    good = {fmt: good_shots(config, tokens=range(1, 7), batches=(1, 3), fmt=fmt, seed=3) for fmt in ("npy", "json")}
    bad = _bad_shots(config, body_limit(config, 8, "json"))

    def shot(i: int) -> Shot:
        return bad[(i // 5) % len(bad)] if i % 5 == 4 else good["npy" if i % 2 else "json"](i)

    count = 240
    outcomes, seconds = run_load(server.url, shot, count=count, concurrency=8, max_seconds=120, timeout_s=60)
    runner = OnnxRunner(seed_dir, provider="cpu")
    check_answers(outcomes, shot, runner.run, load_manifest(seed_dir).artifacts["mha.onnx"].tolerance)
    summary = summarize(outcomes, seconds, count=count)
    assert summary["errors"] == 0 and summary["not_sent"] == 0, summary["problems"]
    assert summary["answered"] == count - count // 5 and summary["refused_as_expected"] == count // 5
    assert {o.status for o in outcomes if not o.good} == {400, 413}
    assert summary["batches"]["max_requests"] > 1 and summary["batches"]["padded"] > 0  # mixed lengths did share


def test_server_still_answers_after_the_load(server: ServerProcess, seed_dir: Path) -> None:
    assert _get(server, "/v1/health")[0] == 200
    x = np.random.default_rng(11).standard_normal((3, 6, 3)).astype(np.float32)
    body, content_type = encode_request(x, "npy")
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("POST", "/v1/context", body=body, headers={"Content-Type": content_type})
    response = connection.getresponse()
    answer = decode_answer(response.read(), response.getheader("content-type"))
    connection.close()
    np.testing.assert_allclose(answer, OnnxRunner(seed_dir, provider="cpu").run(x), rtol=1e-5, atol=1e-5)


def test_loadtest_command(server: ServerProcess, seed_dir: Path, mid_dir: Path, tmp_path: Path) -> None:
    args = ["loadtest", server.url, "--artifact", str(seed_dir), "--requests", "60", "--concurrency", "4",
            "--tokens", "1,6", "--batch", "1,3", "--format", "json", "--json", str(tmp_path / "load.json")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("60 of 60 requests in ") and "requests/s" in result.stdout
    assert "errors      0 (0 lost, 0 wrong, 0 unexpected status); 0 not sent" in result.stdout
    summary = json.loads((tmp_path / "load.json").read_text())
    assert summary["answered"] == 60 and summary["errors"] == 0 and summary["format"] == "json"
    for extra, says in ((["--tokens", "7"], "--tokens: expected counts in 1..6"),
                        (["--artifact", str(mid_dir)], "not in"), (["--batch", "0"], "--batch: expected sizes >= 1"),
                        # all 413s, sent and then counted as failures
                        (["--batch", "3,9"], "--batch: expected sizes in 1..8 (the server's --max-batch), got [3, 9]")):
        result = CliRunner().invoke(cli, [*args[:3], str(seed_dir), *args[4:], *extra])
        code = 1 if says == "not in" else 2  # another folder is a bad file; a bad count a bad value
        assert result.exit_code == code and says in result.stderr and result.stderr.count("\n") == 1, result.output
    result = CliRunner().invoke(cli, ["loadtest", "http://192.0.2.1:8000", "--artifact", str(seed_dir)])
    assert result.exit_code == 1 and "loopback only" in result.stderr
    result = CliRunner().invoke(cli, ["loadtest", f"http://127.0.0.1:{free_port()}", "--artifact", str(seed_dir)])
    assert result.exit_code == 1 and "no answer" in result.stderr  # nothing listens there


def test_serve_bench_judges_and_plots_a_result(tmp_path: Path) -> None:
    """The bench's arithmetic on made-up figures (the bench itself runs in `make serve-bench`, never here)."""
    from benchmarks import serve_bench as sb

    def run(server: str, load: str, round_: int, rps: float, p50: float = 10.0) -> dict[str, object]:
        return {"server": server, "load": load, "round": round_, "answered": 100, "seconds": 100 / rps,
                "requests_per_s": rps, "tokens_per_s": 40 * rps, "errors": 0, "wrong": 0, "not_sent": 0,
                "latency_ms": {"p50": p50, "p90": 2 * p50, "p99": 3 * p50}, "batches": {"mean_requests": 2.0},
                "load_average_before": 1.0}

    runs = [run(s, load, r, {"batch16": 150.0, "batch1": 100.0}.get(s, 120.0))
            for r in (1, 2) for s in sb.SERVERS for load in sb.THROUGHPUT_LOADS]
    runs += [run("batch16", "c1 T16", r, 50.0, p50=4.0) for r in (1, 2)]
    result = {"machine": {"cores": 2, "cpu": "test"}, "rounds": 2, "runs": runs,
              "direct": {"tokens": 16, "p50": 1.0, "p90": 2.0, "rounds": [{"p50": 1.0, "p90": 2.0, "calls": 30}]}}
    targets = {t["target"].split(" (")[0]: t for t in sb.judge(result)}
    assert targets["batching vs --max-batch 1, c16, T16-64"]["value"] == pytest.approx(1.5)
    assert targets["batching vs --max-batch 1, c16, T16-64"]["met"] is True
    assert targets["server overhead vs direct runner, c1, T=16"]["value"] == pytest.approx(3.0)
    assert targets["errors"]["met"] and targets["wrong answers over the bench"]["met"]
    result["targets"] = sb.judge(result)
    json_path, png_path = sb.write_outputs(result, tmp_path)
    assert json.loads(json_path.read_text())["runs"] == runs and png_path.stat().st_size > 10_000
    assert len(sb.summary_rows(result)) == len(runs) + 1


def test_a_client_that_leaves_mid_upload_is_a_request_error_not_an_internal_one() -> None:
    """Starlette raises ClientDisconnect when the body stops with http.disconnect; the services' catch-all would
    log it as an internal error with a traceback."""
    import asyncio

    from starlette.requests import Request

    from mha_runtime.serve.http import read_limited
    from mha_runtime.serve.replica import request_body

    messages = [{"type": "http.request", "body": b'{"x": [[', "more_body": True}, {"type": "http.disconnect"}]

    async def receive() -> dict[str, object]:
        return messages.pop(0)

    request = Request({"type": "http", "method": "POST", "path": "/v1/context", "headers": []}, receive)
    with pytest.raises(RequestError, match=r"^body: the client disconnected before sending all of it$"):
        asyncio.run(read_limited({}, request_body(request), 1000, "test"))


def test_a_stalled_body_is_408_not_a_held_slot() -> None:
    """A client that sends part of its body and then nothing: 34 of them held every slot of a replica, its
    health route too, for as long as they stayed open. The read gives up after idle_s without a byte."""
    import asyncio

    from mha_runtime.serve.http import read_limited

    async def stalled() -> AsyncIterator[bytes]:
        yield b'{"x": [['
        await asyncio.Event().wait()  # the rest never comes

    with pytest.raises(RequestError) as info:
        asyncio.run(read_limited({"content-length": "100"}, stalled(), 1000, "test", idle_s=0.05))
    assert info.value.status == 408
    assert str(info.value) == ("body: no bytes for 0.05 s after 8 of the 100 its Content-Length says; "
                               "send the whole body")


def test_a_trickled_body_is_408_once_under_the_least_rate() -> None:
    """A client that sends a byte at a time, each well within the idle limit, held a slot for as long as it liked;
    the body must be all there after grace_s plus one second per min_rate bytes. The trickle never ends, so the
    read can only end in a refusal."""
    from mha_runtime.serve.http import read_limited

    async def trickle() -> AsyncIterator[bytes]:
        while True:
            yield b" "
            await asyncio.sleep(0.005)  # the client's pace, far under idle_s

    with pytest.raises(RequestError) as info:
        asyncio.run(read_limited({}, trickle(), 10**9, "test", idle_s=60, grace_s=0.2, min_rate=10**6))
    assert info.value.status == 408
    assert re.fullmatch(r"body: \d+ bytes in \d+ s, under 1e\+06 bytes/s after the first 0.2 s; send the whole body",
                        str(info.value)), str(info.value)


def test_the_server_answers_a_stalled_upload_with_408(server: ServerProcess) -> None:
    """Through Ray Serve's proxy: the body's first bytes reach the replica, the rest never comes; the answer is a
    408 in JSON once the body has been idle for BODY_IDLE_S, and the connection is not held open for ever."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=BODY_IDLE_S + 60) as sock:
        sock.sendall(b"POST /v1/context HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n" + b'{"x": [[')
        # The whole answer, by its Content-Length: one read1 could return the head before the body's segment
        # arrived (seen once under a loaded host: the body was empty).
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        body = answer.read()
    assert (answer.version, answer.status) == (11, 408), (answer.status, body)
    assert json.loads(body)["error"].startswith(f"body: no bytes for {BODY_IDLE_S:g} s after 8 of the 100")
    assert _get(server, "/v1/health")[0] == 200

