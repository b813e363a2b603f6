"""What `mha serve` checks and ships for an attention folder, before Ray starts: the model, /v1/contract."""
from __future__ import annotations

from typing import Any

import numpy as np

from mha_runtime.artifact.errors import ServeError, first_line
from mha_runtime.artifact.manifest import MANIFEST_NAME, read_verified
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import spec_for
from mha_runtime.attention.runner import DEFAULT_MODEL, OnnxRunner
from mha_runtime.serve.attention.wire import FORMATS, body_limit
from mha_runtime.serve.options import ServeOptions


def prepare_attention(options: ServeOptions) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Load and run the model once here (a bad artifact, or the decode form, fails before Ray starts);
    return the files the replicas load (manifest and model, sha256-checked) and what /v1/contract answers."""
    model = DEFAULT_MODEL if options.model is None else options.model  # --model '' is refused, not the default
    manifest = load_manifest(options.artifact)
    runner = OnnxRunner(options.artifact, model=model, provider=options.provider, threads=options.threads)
    try:
        runner.run(np.zeros((1, 1, runner.config.d_in), np.float32))
    except Exception as exc:
        raise ServeError(f"{options.artifact / model}: cannot serve it ({first_line(exc)})") from None
    record = manifest.artifacts.get(model)
    tolerance = record.tolerance if record is not None else spec_for(model).tolerance
    info = {"name": manifest.name, "model": model, "sha256": manifest.files[model].sha256,
            "config": runner.config.to_dict(), "contract": runner.contract.to_dict(),
            "tolerance": tolerance.to_dict(), "max_batch": options.max_batch,
            "body_limit_bytes": {fmt: body_limit(runner.config, options.max_batch, fmt) for fmt in FORMATS}}
    files = {MANIFEST_NAME: (options.artifact / MANIFEST_NAME).read_bytes(),
             model: read_verified(options.artifact, model, manifest)}
    return files, info
