"""runtime/ must work on an edge box with onnxruntime and numpy only; its light modules load without onnxruntime."""
import subprocess
import sys
from pathlib import Path

from mha_runtime.attention.manifest import load_manifest


def test_runtime_imports_and_runs_without_torch(seed_dir: Path) -> None:
    code = (
        "import sys, numpy as np\n"
        "import mha_runtime, mha_runtime.attention.golden_check as golden, mha_runtime.attention.npy\n"
        "import mha_runtime.serve.launcher, mha_runtime.serve.deployment\n"
        "import mha_runtime.serve.attention.replica, mha_runtime.serve.decoder.replica\n"
        "import mha_runtime.serve.attention.loadtest, mha_runtime.serve.decoder.loadtest, mha_runtime.triton\n"
        "import mha_runtime.cli.main\n"
        "from mha_runtime.attention.runner import OnnxRunner\n"
        f"r = OnnxRunner({str(seed_dir)!r}, provider='cpu')\n"
        "y = r.run(np.ones((1, 2, 3), np.float32))\n"
        f"res = golden.check_onnx_artifacts({str(seed_dir)!r})\n"
        "assert y.shape == (1, 2, 4) and res and all(x.ok for x in res)\n"
        "print('torch' in sys.modules, 'mha_export' in sys.modules, len(res))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    onnx_files = [f for f, a in load_manifest(seed_dir).artifacts.items() if a.runtime.startswith("onnxruntime")]
    assert out.stdout.split() == ["False", "False", str(3 * len(onnx_files))], out.stdout + out.stderr


def test_light_modules_do_not_import_onnxruntime() -> None:
    code = ("import sys, mha_runtime, mha_runtime.artifact.errors, mha_runtime.attention.registry, "
            "mha_runtime.artifact.manifest, mha_runtime.attention.manifest, mha_runtime.attention.golden\n"
            "print(sorted(m for m in ('onnxruntime', 'numpy', 'torch') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "onnxruntime" not in out.stdout and "torch" not in out.stdout, out.stdout


def test_gpt_generation_runs_without_torch(book_gpt: tuple[object, Path]) -> None:
    code = (
        "import sys\n"
        "from mha_runtime.decoder.generate import Generator\n"
        f"g = Generator({str(book_gpt[1])!r})\n"
        "r = g.generate([g.encode('Hello, I am')], max_new_tokens=3, temperature=0.8, top_k=5, seed=1)\n"
        "print('torch' in sys.modules, 'mha_export' in sys.modules, len(r.ids[0]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "3"], out.stdout + out.stderr
