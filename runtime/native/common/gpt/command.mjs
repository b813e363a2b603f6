// The command line of `generate` (runtime/native/common/gpt.mjs re-exports it; Node and wasm-in-Node share it): the
// arguments, and one generation from them on an open folder.
import { ContractError } from './base.mjs';
import { seedValue } from './pcg64.mjs';
import { generate } from './generate.mjs';
import { noChat } from './chat.mjs';

// More intra-op threads than `mha generate` (runtime/mha_runtime/cli/options.py MAX_THREADS) and the C runner take.
const MAX_THREADS = 1024;

// generate DIR (--prompt-ids 1,2,3 | --prompt TEXT | --chat TEXT) [--max-new-tokens N] [--temperature T] [--top-k K] [--seed S]
//          [--no-eos] [--form FILE] [--threads N] [--warmup N] [--json] [--text]; null when it is not that form.
// --warmup N: N untimed generations of the same request first (a fresh process's first one includes the runtime's
// own start: V8 runs onnxruntime-web's wasm on its baseline compiler until the optimizing tier has compiled it).
export function parseGenerateArgs(argv) {
  const o = { dir: null, promptIds: null, prompt: null, chat: null, maxNewTokens: 32, temperature: 0, topK: null, seed: null,
    eos: true, form: null, threads: null, warmup: 0, json: false, text: false };
  const number = (flag, text) => {
    const v = /^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$/.test(text) ? Number(text) : NaN;
    if (!Number.isFinite(v)) throw new ContractError(`${flag}: expected a number, got '${text.slice(0, 30)}'`);
    return v;
  };
  const integer = (flag, text) => {
    if (!/^-?[0-9]+$/.test(text) || !Number.isSafeInteger(Number(text))) throw new ContractError(`${flag}: expected an integer, got '${text.slice(0, 30)}'`);
    return Number(text);
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i], next = argv[i + 1];
    const value = () => {
      if (next === undefined) throw new ContractError(`${a}: expected a value`);
      i++;
      return next;
    };
    // one prompt: `mha generate` makes a batch of a repeated one, so the last silently stood for all (the C runner's
    // words)
    if ((a === '--prompt-ids' && o.promptIds !== null) || (a === '--prompt' && o.prompt !== null)
      || (a === '--chat' && o.chat !== null)) {
      throw new ContractError(`${a}: given twice (this runner runs one prompt)`);
    }
    if (a === '--prompt-ids') o.promptIds = parseIds(value());
    else if (a === '--prompt') o.prompt = value();
    else if (a === '--chat') o.chat = value();
    else if (a === '--max-new-tokens') o.maxNewTokens = integer(a, value());
    else if (a === '--temperature') o.temperature = number(a, value());
    else if (a === '--top-k') o.topK = integer(a, value());
    else if (a === '--seed') o.seed = seedValue(value());
    else if (a === '--form') o.form = value();
    else if (a === '--threads') o.threads = integer(a, value());
    else if (a === '--warmup') o.warmup = integer(a, value());
    else if (a === '--no-eos') o.eos = false;
    else if (a === '--eos') o.eos = true;
    else if (a === '--json') o.json = true;
    else if (a === '--text') o.text = true;
    else if (!a.startsWith('--') && o.dir === null) o.dir = a;
    else return null;
  }
  if (o.dir === null) return null;
  if (o.chat !== null && (o.promptIds !== null || o.prompt !== null)) {
    throw new ContractError('give --chat TEXT or a prompt (--prompt, --prompt-ids), not both: the chat\'s message is its prompt');
  }
  if (o.chat === null && (o.promptIds === null) === (o.prompt === null)) {
    throw new ContractError('give the prompt as --prompt TEXT or as --prompt-ids 1,2,3 (one of the two)');
  }
  if (o.threads !== null && o.threads < 1) throw new ContractError(`--threads: expected an integer >= 1, got ${o.threads}`);
  // the bound of `mha generate` and the C runner: 100,000 asked of onnxruntime-node started that many threads and
  // never returned
  if (o.threads !== null && o.threads > MAX_THREADS) throw new ContractError(`--threads: expected an integer from 1 to ${MAX_THREADS}, got ${o.threads}`);
  // both would write the streamed text and then the JSON object on one stdout, which is then neither
  if (o.json && o.text) throw new ContractError('--json and --text: expected one of the two, got both');
  if (o.warmup < 0 || o.warmup > 100) throw new ContractError(`--warmup: expected an integer from 0 to 100, got ${o.warmup}`);
  return o;
}

// '1,2,3' -> [1, 2, 3]; anything else is one line naming the bad piece (as `mha generate`).
export function parseIds(text) {
  if (!text.trim()) throw new ContractError('--prompt-ids: expected comma-separated token ids, got an empty prompt');
  return text.split(',').map((p) => {
    const piece = p.trim();
    if (!/^[-+]?[0-9]+$/.test(piece) || !Number.isSafeInteger(Number(piece))) {
      throw new ContractError(`--prompt-ids: expected comma-separated integers, got '${piece.slice(0, 30)}'`);
    }
    return Number(piece);
  });
}

// One generation from parsed arguments on an open folder: the prompt (ids, or text through the tokenizer, or --chat's
// message through the folder's chat template: `chat`, loadChat's, null without one), the checks before anything
// runs, then the run. -> { prompt_ids, ...generate()'s result without first_logits, text? }
export async function runGenerate(decoder, manifest, tokenizer, o, { onToken = null, chat = null, where = manifest.name } = {}) {
  let prompt = o.promptIds;
  let stops = manifest.stop_ids;  // every eos id of the folder; a chat's reply ends at its end of turn too
  if (o.chat != null) {
    if (!chat) throw noChat(where);
    prompt = chat.encode([{ role: 'user', content: o.chat }], '--chat');
    stops = chat.stopIds;
  } else if (o.prompt !== null) {
    if (!tokenizer) throw new ContractError(`${manifest.name}: this folder has no tokenizer (exported without --tokenizer); give token ids (--prompt-ids)`);
    prompt = tokenizer.encode(o.prompt);
  }
  const eosId = o.eos ? stops : null;
  const request = { maxNewTokens: o.maxNewTokens, temperature: o.temperature, topK: o.topK, seed: o.seed, eosId };
  for (let w = 0; w < (o.warmup || 0); w++) await generate(decoder, prompt, request);
  const out = await generate(decoder, prompt, { ...request, onToken });
  delete out.first_logits;
  return { prompt_ids: prompt, ...out, text: tokenizer ? tokenizer.decode(out.ids) : null };
}
