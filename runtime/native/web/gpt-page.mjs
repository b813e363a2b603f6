// The GPT page: loads a GPT folder (?artifact=PATH), checks the sha256 of the decoder and the tokenizer against the
// manifest before anything runs, tokenizes in the page (@huggingface/tokenizers reading tokenizer.json) and streams
// the generated text token by token, with time to first token and tokens/s; for a folder with a chat template, a chat
// box too (gpt-chat.mjs: the template through @huggingface/jinja); or (?check=1) runs every golden
// generation and shows them as a table. No framework, no bundler: onnxruntime-web and the tokenizer are imported by
// URL from this folder's node_modules (`make web-build`); the generation contract is runtime/native/common/gpt.mjs.
// When done, body[data-done="1"] is set and window.mhaResult holds the result (what tests/native/test_gpt_js.py reads).
import * as gpt from '../common/gpt.mjs';
import { openSession } from './core.mjs';
import { chatBox } from './gpt-chat.mjs';

const ORT_URL = './node_modules/onnxruntime-web/dist/ort.wasm.min.mjs';
const TOKENIZERS_URL = './node_modules/@huggingface/tokenizers/dist/tokenizers.min.mjs';
const JINJA_URL = './node_modules/@huggingface/jinja/dist/index.js';
const query = new URLSearchParams(location.search);
const artifact = (query.get('artifact') || 'artifacts/gpt-mini').replace(/^\/+|\/+$/g, '');
const base = new URL(`/${artifact}/`, location.origin);
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => `&#${c.charCodeAt(0)};`);

const io = {
  where: base.pathname.replace(/\/$/, ''),
  async bytes(rel, what) {
    const r = await fetch(new URL(rel, base), { cache: 'no-store' });
    if (r.status === 404) {
      throw new gpt.ArtifactError(`${base.pathname}${rel}: ${what ? `expected ${what}, found none` : 'listed in the manifest but missing'} (HTTP 404)`);
    }
    if (!r.ok) throw new gpt.ArtifactError(`${base.pathname}${rel}: HTTP ${r.status}`);
    return new Uint8Array(await r.arrayBuffer());
  },
  async sha256(bytes) {
    if (!globalThis.crypto?.subtle) {
      throw new gpt.ArtifactError('crypto.subtle is missing (not a secure context): open the page through http://127.0.0.1 or http://localhost');
    }
    const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
    return Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
  },
};

async function imports() {
  const load = async (url) => {
    try {
      return await import(url);
    } catch (e) {
      throw new Error(`cannot import ${url} (${e.message}): run \`make web-build\` and serve the repo root (\`make web\`)`);
    }
  };
  const ort = await load(ORT_URL);
  ort.env.wasm.numThreads = 1;  // no SharedArrayBuffer needed, so no COOP/COEP headers
  ort.env.logLevel = 'error';
  return { ort, Tokenizer: (await load(TOKENIZERS_URL)).Tokenizer, Template: (await load(JINJA_URL)).Template };
}

// A frame for the browser to paint the text so far (the wasm run itself holds the main thread).
const paint = () => new Promise((resolve) => { requestAnimationFrame(() => setTimeout(resolve, 0)); });

function renderCheck(result) {
  const rows = [];
  for (const a of result.artifacts) {
    for (const c of a.cases) {
      rows.push(`<tr class="${c.ok ? 'pass' : 'fail'}"><td>${esc(a.file)}</td><td>${esc(c.name)}</td><td>${esc(JSON.stringify(c.shape))}</td>`
        + `<td class="num">${c.new_tokens ?? ''}</td><td class="num">${c.max_abs === null ? '' : c.max_abs.toPrecision(3)}</td>`
        + `<td class="ok">${c.ok ? 'pass' : 'FAIL'}</td><td>${c.error ? esc(c.error) : ''}</td></tr>`);
    }
  }
  const table = document.createElement('table');
  table.id = 'results';
  table.innerHTML = '<tr><th>decoder</th><th>case</th><th>prompt</th><th>new ids equal</th><th>first-step max abs error</th>'
    + `<th>pass</th><th>error</th></tr>${rows.join('')}`;
  document.body.append(table);
  const summary = $('summary');
  summary.textContent = `${result.passed} passed, ${result.failed} failed`
    + (result.not_loadable.length ? `; not loadable: ${result.not_loadable.map((a) => a.file).join(', ')}` : '');
  summary.className = result.failed || !result.passed ? 'fail' : 'pass';
}

async function check({ ort, Tokenizer }) {
  $('info').textContent = `golden generations of ${base.pathname}, onnxruntime-web ${ort.env.versions.web} (wasm, 1 thread)`;
  const t0 = performance.now();
  const result = await gpt.checkGenerations(ort, io, { openSession: (bytes) => openSession(ort, bytes), alias: false, Tokenizer });
  Object.assign(result, { runtime: 'browser', backend: 'wasm', threads: ort.env.wasm.numThreads,
    onnxruntime_web: ort.env.versions?.web ?? null, host: navigator.userAgent, artifact_dir: base.pathname,
    total_ms: performance.now() - t0 });
  renderCheck(result);
  return result;
}

function control(id, name, parse) {
  const v = query.get(name);
  if (v !== null) $(id).value = v;
  return () => parse($(id).value.trim());
}

async function generatePage({ ort, Tokenizer, Template }) {
  const manifest = await gpt.readGptManifest(io);
  const listed = gpt.listedForms(manifest);
  const form = query.get('form') || (listed.includes(gpt.CONCAT_FORM) ? gpt.CONCAT_FORM : listed[0]);
  if (!form || !listed.includes(form)) throw new gpt.ArtifactError(`${io.where}: no decoder ${form || ''} listed in the manifest`);
  const { arch, n_layers: layers, n_heads: heads, kv_heads: kv, context_length: context } = manifest.shapes;
  $('info').textContent = `${manifest.name} (${arch}): ${layers} layers, ${heads} heads (${kv} key/value), context `
    + `${context}; ${form} on onnxruntime-web ${ort.env.versions.web} (wasm, 1 thread)`;
  const bytes = await gpt.verifiedBytes(io, manifest, form);
  const tokenizer = await gpt.loadTokenizer(io, manifest, Tokenizer);
  if (!tokenizer) throw new gpt.ArtifactError(`${io.where}: this folder has no tokenizer (exported without --tokenizer): the page needs one`);
  $('verified').textContent = `sha256 checked: ${form} ${manifest.files[form].sha256.slice(0, 12)}…, `
    + `${manifest.tokenizer.file || gpt.TOKENIZER_FILE} ${manifest.files[manifest.tokenizer.file || gpt.TOKENIZER_FILE].sha256.slice(0, 12)}…`;
  const session = await openSession(ort, bytes);
  const decoder = gpt.makeDecoder(ort, session, manifest, form, { alias: false });
  const prompt = control('prompt', 'prompt', (v) => v);
  const maxNew = control('max-new-tokens', 'max_new_tokens', (v) => Number(v));
  const temperature = control('temperature', 'temperature', (v) => (v === '' ? 0 : Number(v)));
  const topK = control('top-k', 'top_k', (v) => (v === '' ? null : Number(v)));
  const seed = control('seed', 'seed', (v) => (v === '' ? null : v));
  $('panel').hidden = false;
  // The chat box, only for a folder with a chat template; ?chat=TEXT (repeated: one turn each) and ?system=TEXT
  // preset it, and with autorun=1 the turns are sent on load instead of the prompt.
  const chat = await gpt.loadChat(io, manifest, tokenizer, Template);
  const settings = () => ({ maxNewTokens: maxNew(), temperature: temperature(), topK: topK(), seed: seed() });
  const box = chat ? chatBox({ chat, decoder, tokenizer, settings, paint }) : null;
  if (box && query.get('system') !== null) $('system').value = query.get('system');

  const run = async () => {
    $('error').textContent = '';
    $('generate').disabled = true;
    const output = $('output');
    output.textContent = '';
    try {
      const text = prompt();
      const ids = tokenizer.encode(text);
      const shown = document.createElement('span');
      shown.className = 'prompt';
      shown.textContent = tokenizer.decode(ids);
      const generated = document.createElement('span');
      generated.className = 'generated';
      generated.id = 'generated';
      output.append(shown, generated);
      const stream = new gpt.TextStream(tokenizer);
      const trace = [];
      const t0 = performance.now();
      const r = await gpt.generate(decoder, ids, {
        maxNewTokens: maxNew(), temperature: temperature(), topK: topK(), seed: seed(), eosId: manifest.stop_ids,
        onToken: async (token) => {
          generated.textContent += stream.push(token);
          trace.push({ tokens: stream.ids.length, chars: generated.textContent.length, ms: performance.now() - t0 });
          $('stats').textContent = `${stream.ids.length} tokens…`;
          await paint();
        },
      });
      generated.textContent += stream.end();  // a last token that ends inside a character shows as U+FFFD
      $('stats').textContent = `${r.ids.length} tokens, time to first token ${(r.time_to_first_token_s * 1e3).toFixed(1)} ms, `
        + `${r.tokens_per_s.toFixed(1)} tokens/s (stopped: ${r.stop.replaceAll('_', ' ')}; `
        + `${temperature() === 0 ? 'greedy' : `seed ${r.seed}`})`;
      return { name: manifest.name, mode: 'generate', form, prompt: text, prompt_ids: ids, ids: r.ids, stop: r.stop,
        seed: r.seed, text: generated.textContent, trace, time_to_first_token_s: r.time_to_first_token_s,
        tokens_per_s: r.tokens_per_s, onnxruntime_web: ort.env.versions?.web ?? null, host: navigator.userAgent };
    } catch (e) {
      $('error').textContent = `error: ${String((e && e.message) || e).split('\n')[0]}`;
      throw e;
    } finally {
      $('generate').disabled = false;
    }
  };
  $('generate').addEventListener('click', () => { run().then((r) => { window.mhaResult = r; }, () => {}); });
  $('generate').disabled = false;
  const said = query.getAll('chat');
  if (query.get('autorun') === '1' && said.length) {
    if (!box) throw gpt.noChat(io.where);
    for (const text of said) await box.send(text);
    return { name: manifest.name, mode: 'chat', form, turns: box.turns, onnxruntime_web: ort.env.versions?.web ?? null };
  }
  if (query.get('autorun') === '1') return run();
  return { name: manifest.name, mode: 'ready', form, chat: Boolean(box) };
}

async function main() {
  const modules = await imports();
  return query.get('check') === '1' ? check(modules) : generatePage(modules);
}

main().then((result) => { window.mhaResult = result; }, (e) => {
  const message = String((e && e.message) || e).split('\n')[0];
  $('error').textContent = `error: ${message}`;
  window.mhaResult = { error: message };
}).finally(() => { document.body.dataset.done = '1'; });
