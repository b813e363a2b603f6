"""runtime/ must work on an edge box with onnxruntime and numpy only."""
import subprocess
import sys
from pathlib import Path

from mha_runtime.manifest import load_manifest


def test_runtime_imports_and_runs_without_torch(seed_dir: Path) -> None:
    code = (
        "import sys, numpy as np\n"
        "import mha_runtime, mha_runtime.golden, mha_runtime.arrays\n"
        "import mha_runtime.serve, mha_runtime.serve_app, mha_runtime.loadtest, mha_runtime.triton\n"
        "from mha_runtime.runner import OnnxRunner\n"
        f"r = OnnxRunner({str(seed_dir)!r}, provider='cpu')\n"
        "y = r.run(np.ones((1, 2, 3), np.float32))\n"
        f"res = mha_runtime.golden.check_onnx_artifacts({str(seed_dir)!r})\n"
        "assert y.shape == (1, 2, 4) and res and all(x.ok for x in res)\n"
        "print('torch' in sys.modules, len(res))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    onnx_files = [f for f, a in load_manifest(seed_dir).artifacts.items() if a.runtime.startswith("onnxruntime")]
    assert out.stdout.split() == ["False", str(3 * len(onnx_files))], out.stdout + out.stderr
