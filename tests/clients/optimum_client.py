"""Optimum's ORTModelForCausalLM on GPT folders of `mha export --gpt`, loaded as they are: from_pretrained(folder)
with no file_name. Runs in its own venv (optimum-requirements.txt: optimum-onnx pins transformers < 4.58, the dev
environment has transformers 5), never imports this project.

Usage: python optimum_client.py JOB.json, the protocol of tests/clients/transformersjs/client.mjs:
JOB = {"jobs": [{"folder", "prompts": [[ids]], "max_new_tokens", "batch", "logits_dir", "eos", "pad"}]} (eos false: no
stop at the eos of generation_config.json, as the golden cases; pad: the id under mask 0, default GPT-2's eos); prints
{"results": [{"solo": [[new ids]], "batch": [[new ids]] | null, "logits": [files] | null}]}: greedy ids of each
prompt alone and of all prompts as one left-padded batch (pad, mask 0), and the first step's logits (the
prompt's last token) of each prompt alone as little-endian float32 files.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from optimum.onnxruntime import ORTModelForCausalLM

PAD = 50256


def ids2d(rows: list[list[int]], pad: int = PAD) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.int64)
    mask = torch.zeros((len(rows), width), dtype=torch.int64)
    for b, row in enumerate(rows):  # left padding
        ids[b, width - len(row):] = torch.tensor(row)
        mask[b, width - len(row):] = 1
    return ids, mask


def greedy(model: Any, rows: list[list[int]], new: int, eos: bool, pad: int = PAD) -> list[list[int]]:
    ids, mask = ids2d(rows, pad)
    stop = {} if eos else {"eos_token_id": None}
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=pad,
                         **stop)
    return out[:, ids.shape[1]:].tolist()


def run(job: dict[str, Any]) -> dict[str, Any]:
    model = ORTModelForCausalLM.from_pretrained(job["folder"])
    new, eos, pad = job["max_new_tokens"], job.get("eos", True), job.get("pad", PAD)
    solo = [greedy(model, [p], new, eos, pad)[0] for p in job["prompts"]]
    batch = greedy(model, job["prompts"], new, eos, pad) if job["batch"] else None
    logits = None
    if job.get("logits_dir"):
        logits = []
        for i, prompt in enumerate(job["prompts"]):
            ids, mask = ids2d([prompt])
            with torch.no_grad():
                last = model(input_ids=ids, attention_mask=mask).logits[0, -1]
            file = Path(job["logits_dir"]) / f"optimum.{i}.logits.bin"
            file.write_bytes(last.to(torch.float32).numpy().astype("<f4").tobytes())
            logits.append(str(file))
    return {"solo": solo, "batch": batch, "logits": logits}


if __name__ == "__main__":
    jobs = json.loads(Path(sys.argv[1]).read_text())["jobs"]
    print(json.dumps({"results": [run(job) for job in jobs]}))
