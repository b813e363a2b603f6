// transformers.js (@huggingface/transformers, package-lock.json here) on GPT folders of `mha export --gpt`, loaded
// as they are: AutoModelForCausalLM.from_pretrained(folder) with no option, remote models off.
// Usage: node client.mjs JOB.json; JOB = {"jobs": [{"folder", "prompts": [[ids]], "max_new_tokens", "batch",
// "logits_dir", "eos", "pad"}]} (eos false: no stop at the eos of generation_config.json, as the golden cases; pad:
// the id under mask 0, default GPT-2's eos). Prints {"results": [{"solo": [[new ids]], "batch": [[new ids]] | null, "logits": [files] |
// null}]}: greedy ids of each prompt alone and of all prompts as one left-padded batch (pad, mask 0), and
// the first step's logits (the prompt's last token) of each prompt alone as little-endian float32 files.
// The same protocol as tests/clients/optimum_client.py; tests/decoder/test_gpt_dropin.py compares the answers.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AutoModelForCausalLM, Tensor, env } from '@huggingface/transformers';

env.allowRemoteModels = false; // a local folder, nothing fetched
env.useFSCache = false;

const PAD = 50256n;

function ids2d(rows, pad = PAD) {
  const width = Math.max(...rows.map((r) => r.length));
  const ids = new BigInt64Array(rows.length * width).fill(pad);
  const mask = new BigInt64Array(rows.length * width);
  rows.forEach((row, b) => row.forEach((id, t) => {
    const at = b * width + width - row.length + t; // left padding
    ids[at] = BigInt(id);
    mask[at] = 1n;
  }));
  const dims = [rows.length, width];
  return { input_ids: new Tensor('int64', ids, dims), attention_mask: new Tensor('int64', mask, dims), width };
}

async function greedy(model, rows, maxNew, eos, pad = PAD) {
  const { input_ids, attention_mask, width } = ids2d(rows, pad);
  const stop = eos ? {} : { eos_token_id: null };
  const out = await model.generate({ input_ids, attention_mask, max_new_tokens: maxNew, do_sample: false, ...stop });
  return out.tolist().map((row) => row.slice(width).map(Number));
}

async function run(job) {
  const model = await AutoModelForCausalLM.from_pretrained(job.folder);
  const solo = [];
  const eos = job.eos ?? true;
  const pad = job.pad === undefined ? PAD : BigInt(job.pad);
  for (const prompt of job.prompts) solo.push((await greedy(model, [prompt], job.max_new_tokens, eos, pad))[0]);
  const batch = job.batch ? await greedy(model, job.prompts, job.max_new_tokens, eos, pad) : null;
  let logits = null;
  if (job.logits_dir) {
    logits = [];
    for (const [i, prompt] of job.prompts.entries()) {
      const { input_ids, attention_mask } = ids2d([prompt]);
      const out = await model({ input_ids, attention_mask });
      const [, t, v] = out.logits.dims;
      const last = Float32Array.from(out.logits.data.subarray((t - 1) * v, t * v));
      const file = join(job.logits_dir, `transformersjs.${i}.logits.bin`);
      writeFileSync(file, Buffer.from(last.buffer));
      logits.push(file);
    }
  }
  await model.dispose();
  return { solo, batch, logits };
}

const { jobs } = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const results = [];
for (const job of jobs) results.push(await run(job));
process.stdout.write(JSON.stringify({ results }) + '\n');
