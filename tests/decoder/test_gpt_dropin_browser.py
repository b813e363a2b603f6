"""transformers.js loads a GPT folder as it is on each device it offers in a browser, where the file it picks by
default differs from Node's (issue 56).

In Node on Linux x64 transformers.js 4.3.2 offers cuda, webgpu and cpu, cpu by default with fp32 files
(tests/decoder/test_gpt_dropin.py runs it). In a browser it offers wasm, its default, whose default dtype is q8: it
would ask for onnx/model_quantized.onnx, which the folders do not have; only config.json's
`"transformers.js_config": {"dtype": "fp32"}` makes it load onnx/model.onnx. webgpu and webnn are offered where
the browser has them (headless chromium without a GPU: skipped, saying which is missing).

Here the browser build (tests/clients/transformersjs/browser.html, driven by browser.mjs in Debian's headless
chromium with playwright-core: `make chromium web-build transformersjs`) calls
AutoModelForCausalLM.from_pretrained(name) with no device and no dtype on the session's gpt-mini folder, served
on 127.0.0.1 by this test's own server, and generates the greedy ids of the folder's golden cases.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote, urlsplit

import pytest

from helpers import REPO
from mha_runtime.decoder.contract import HF_CONFIG, ONNX_MODEL
from mha_runtime.decoder.golden import GENERATIONS_FILE, load_generations
from mha_runtime.decoder.manifest import load_gpt_manifest

TJS = REPO / "tests" / "clients" / "transformersjs"
PAGE = "/tests/clients/transformersjs/browser.html"
PLAYWRIGHT = REPO / "runtime" / "native" / "web" / "node_modules" / "playwright-core"
CHROMIUM = Path("/usr/bin/chromium")
MODELS = "/models/"  # env.localModelPath: the folder is served at /models/<its name>/
JOB = "/job.json"  # the page's job, served from memory
PAGE_DEADLINE_S = 120  # chromium's start, the page's load and 4 x 16 tokens: about 10 s here
QUANTIZED = "onnx/model_quantized.onnx"  # the wasm device's default file (dtype q8)
BROWSER_DEVICES = {"wasm", "webgpu", "webnn", "webnn-npu", "webnn-gpu", "webnn-cpu"}


class _Server(ThreadingHTTPServer):
    """The repository root at /, one folder at /models/<name>/, the job at /job.json; every request logged."""

    daemon_threads = True

    def __init__(self, folder: Path, name: str, job: dict[str, Any]) -> None:
        self.mounts = {f"{MODELS}{name}/": folder, "/": REPO}  # longest prefix first
        self.job = json.dumps(job).encode()
        self.requests: list[tuple[str, int]] = []  # (path, status), in order
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)  # loopback only; port 0: the kernel picks a free one


class _Handler(SimpleHTTPRequestHandler):
    server: _Server
    timeout = 30  # s: an idle connection is closed, no handler thread waits for ever
    extensions_map: ClassVar[dict[str, str]] = {**SimpleHTTPRequestHandler.extensions_map, ".mjs": "text/javascript",
                      ".wasm": "application/wasm"}  # module scripts and streaming wasm need their types

    def translate_path(self, path: str) -> str:
        path = unquote(urlsplit(path).path)
        for prefix, root in self.server.mounts.items():
            if path.startswith(prefix):
                rel = Path(path[len(prefix):])
                # Nothing outside the mounts: "" is no file (404).
                return "" if ".." in rel.parts else str(root / rel)
        return ""

    def do_GET(self) -> None:
        if urlsplit(self.path).path == JOB:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(self.server.job)))
            self.end_headers()
            self.wfile.write(self.server.job)
            return
        super().do_GET()

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        with self.server.lock:
            self.server.requests.append((unquote(urlsplit(self.path).path), int(code)))

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log above is what the tests read; nothing on stderr


@contextmanager
def _serve(folder: Path, job: dict[str, Any]) -> Iterator[_Server]:
    """The server in a thread for one page run; shut down (its port closed) on the way out."""
    server = _Server(folder, job["name"], job)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _golden_greedy(folder: Path) -> dict[str, dict[str, Any]]:
    """{case name: {prompt_ids, max_new_tokens, ids}} of the folder's temperature-0 golden cases (sha256-checked)."""
    golden = load_generations(folder, load_gpt_manifest(folder))
    assert golden.doc["eos_applied"] is False  # the page does not stop at eos either
    cases = {c.name: {"prompt_ids": list(c.prompt_ids), "max_new_tokens": c.max_new_tokens, "ids": list(c.ids)}
             for c in golden.cases if c.temperature == 0}
    assert cases, f"{folder}/{GENERATIONS_FILE}: no greedy case"
    return cases


def _browse(folder: Path, cases: dict[str, dict[str, Any]], device: str | None = None) -> dict[str, Any]:
    """browser.mjs on browser.html for the folder; its JSON plus the server's log ("served": [(path, status)])."""
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: run `make chromium` (apt-get install chromium)"
    assert PLAYWRIGHT.is_dir(), f"{PLAYWRIGHT} is missing: run `make web-build`"
    assert (TJS / "node_modules" / "@huggingface" / "transformers").is_dir(), "run `make transformersjs`"
    job = {"root": MODELS, "name": folder.name, "device": device,
           "cases": [{"name": n, "prompt_ids": c["prompt_ids"], "max_new_tokens": c["max_new_tokens"]}
                     for n, c in cases.items()]}
    with _serve(folder, job) as server:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        # Its own process group, killed whole past the deadline: no chromium outlives the test.
        proc = subprocess.Popen(["node", str(TJS / "browser.mjs"), f"{base}{PAGE}?job={JOB}", "--timeout",
                                 str(PAGE_DEADLINE_S), "--chromium", str(CHROMIUM)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=PAGE_DEADLINE_S + 60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        assert proc.returncode == 0, err[-4000:]
        doc = json.loads(out.strip().splitlines()[-1])
        with server.lock:
            doc["served"] = list(server.requests)
    doc["base"] = base
    return doc


def _fetched(doc: dict[str, Any], name: str) -> list[tuple[str, int]]:
    """The folder's files the server was asked for: (path inside the folder, status)."""
    prefix = f"{MODELS}{name}/"
    return [(path[len(prefix):], status) for path, status in doc["served"] if path.startswith(prefix)]


@pytest.fixture(scope="module")
def greedy(gpt_mini: Path) -> dict[str, dict[str, Any]]:
    return _golden_greedy(gpt_mini)


@pytest.fixture(scope="module")
def default_run(gpt_mini: Path, greedy: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The page with no device and no dtype on gpt-mini, served as it is (no copy: read only)."""
    return _browse(gpt_mini, greedy)


# ---- wasm: the browser's default device ----------------------------------------------------------------------


def test_browser_default_is_wasm_and_generates_the_golden_ids(default_run: dict[str, Any],
                                                              greedy: dict[str, dict[str, Any]]) -> None:
    result = default_run["result"]
    assert result["error"] is None, (result["error"], default_run["log"])
    assert result["session"] == {"device": "wasm", "dtype": "fp32"}  # the default device, the config's dtype
    assert result["devices"][-1] == "wasm" and set(result["devices"]) <= BROWSER_DEVICES, result["devices"]
    assert result["ids"] == {name: case["ids"] for name, case in greedy.items()}
    assert default_run["log"] == []  # no page error, failed request or console error


def test_browser_fetches_onnx_model_onnx_and_nothing_else_of_the_folder(default_run: dict[str, Any],
                                                                        gpt_mini: Path) -> None:
    """The file is the config's choice (fp32: onnx/model.onnx, through its link), not wasm's default q8 file; the
    runtime's wasm is the one in node_modules, and nothing is fetched from anywhere but the test's server."""
    fetched = _fetched(default_run, gpt_mini.name)
    assert (ONNX_MODEL, 200) in fetched and (HF_CONFIG, 200) in fetched, fetched
    assert not [path for path, _ in fetched if path.startswith("onnx/") and path != ONNX_MODEL], fetched
    assert all(status == 200 for _, status in fetched), fetched  # no probe for a file the folder lacks
    wasm = [(p, s) for p, s in default_run["served"] if p.endswith(".wasm")]
    assert wasm and all(p.startswith("/tests/clients/transformersjs/node_modules/onnxruntime-web/dist/") and s == 200
                        for p, s in wasm), wasm
    assert default_run["requests"] and all(url.startswith(default_run["base"] + "/")
                                           for url in default_run["requests"]), default_run["requests"]


def test_without_transformersjs_config_the_browser_asks_for_the_q8_file(gpt_mini: Path, tmp_path: Path,
                                                                        greedy: dict[str, dict[str, Any]]) -> None:
    """The control: config.json without "transformers.js_config" and the same page asks for wasm's default file
    (onnx/model_quantized.onnx), which the folder does not have, and loads nothing; the two tests above would
    fail on such a folder."""
    folder = Path(shutil.copytree(gpt_mini, tmp_path / gpt_mini.name, symlinks=True))  # onnx/model.onnx: a link
    config = json.loads((folder / HF_CONFIG).read_text())
    del config["transformers.js_config"]
    (folder / HF_CONFIG).write_text(json.dumps(config, indent=2))
    doc = _browse(folder, greedy)
    assert doc["result"]["error"] and QUANTIZED in doc["result"]["error"], doc["result"]
    assert doc["result"]["session"] is None and doc["result"]["ids"] == {}
    fetched = _fetched(doc, folder.name)
    assert (QUANTIZED, 404) in fetched and not [p for p, _ in fetched if p == ONNX_MODEL], fetched


# ---- webgpu and webnn: where the browser has them ----------------------------------------------------------------


def _missing(device: str, result: dict[str, Any]) -> str | None:
    """Why the browser cannot run the device, or None."""
    if device == "webgpu":
        if "webgpu" not in result["devices"]:
            return "webgpu: this chromium has no navigator.gpu, transformers.js does not offer it"
        if not result["webgpu_adapter"]:
            return "webgpu: offered (navigator.gpu), but headless chromium here has no adapter (no GPU)"
        return None
    if not result["webnn"]:
        return "webnn: this chromium has no navigator.ml (WebNN), transformers.js does not offer it"
    return None


@pytest.mark.parametrize("device", ["webgpu", "webnn"])
def test_browser_gpu_devices_generate_the_golden_ids(device: str, default_run: dict[str, Any], gpt_mini: Path,
                                                     greedy: dict[str, dict[str, Any]]) -> None:
    """The same folder with device given (still no dtype) where the browser offers it; else a skip saying why."""
    assert default_run["result"]["error"] is None, default_run["result"]["error"]
    reason = _missing(device, default_run["result"])
    if reason:
        pytest.skip(reason)
    doc = _browse(gpt_mini, greedy, device)
    assert doc["result"]["error"] is None, (doc["result"]["error"], doc["log"])
    assert doc["result"]["session"]["dtype"] == "fp32"
    assert doc["result"]["ids"] == {name: case["ids"] for name, case in greedy.items()}
    fetched = _fetched(doc, gpt_mini.name)
    assert (ONNX_MODEL, 200) in fetched and QUANTIZED not in [p for p, _ in fetched], fetched
