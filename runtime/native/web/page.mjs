// The browser page: every golden case of one artifact folder on onnxruntime-web (wasm, one thread), as a table.
// No framework, no bundler: onnxruntime-web is imported by URL from this folder's node_modules (`make web-build`).
// When done, body[data-done="1"] is set and window.mhaResult holds the summary (what tests/native/test_web.py reads).
import { ArtifactError, bookRow, checkArtifacts, g3 } from './core.mjs';

const ORT_URL = './node_modules/onnxruntime-web/dist/ort.wasm.min.mjs';  // fetches ort-wasm-simd-threaded.{mjs,wasm} beside it
const query = new URLSearchParams(location.search);
const artifact = (query.get('artifact') || 'artifacts/seed').replace(/^\/+|\/+$/g, '');
const asked = Number.parseInt(query.get('repeats') ?? '', 10);
const repeats = asked >= 0 ? asked : 3;  // timed runs per case, after one untimed run; 0: the check alone
const base = new URL(`/${artifact}/`, location.origin);
const $ = (id) => document.getElementById(id);
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => `&#${c.charCodeAt(0)};`);

const io = {
  where: base.pathname.replace(/\/$/, ''),
  async fetchOk(rel, what) {
    const r = await fetch(new URL(rel, base));
    if (r.status === 404 && what) throw new ArtifactError(`${base.pathname}${rel}: expected ${what}, found none (HTTP 404)`);
    if (!r.ok) throw new ArtifactError(`${base.pathname}${rel}: HTTP ${r.status}`);
    return r;
  },
  async bytes(rel) { return new Uint8Array(await (await this.fetchOk(rel)).arrayBuffer()); },
  async json(rel, what) {
    const text = await (await this.fetchOk(rel, what)).text();
    try { return JSON.parse(text); } catch (e) { throw new ArtifactError(`${base.pathname}${rel}: expected JSON (${e.message})`); }
  },
  async sha256(bytes) {
    if (!globalThis.crypto?.subtle) {
      throw new ArtifactError('crypto.subtle is missing (not a secure context): open the page through http://127.0.0.1 or http://localhost');
    }
    const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
    return Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('');
  },
};

function tolerance(t) {
  return `atol ${g3(t.atol)}` + (t.rtol ? `, rtol ${g3(t.rtol)}` : '') + (t.rel_l2 !== null && t.rel_l2 !== undefined ? `, rel_l2 ${g3(t.rel_l2)}` : '');
}

function render(result) {
  const rows = [];
  for (const a of result.artifacts) {
    if (a.not_loadable) {
      rows.push(`<tr class="skip"><td>${esc(a.file)}</td><td colspan="6">not loadable by onnxruntime-web: ${esc(a.not_loadable)}</td></tr>`);
      continue;
    }
    for (const c of a.cases) {
      rows.push(`<tr class="${c.ok ? 'pass' : 'fail'}"><td>${esc(a.file)}</td><td>${esc(c.name)}</td><td>${esc(JSON.stringify(c.shape))}</td>`
        + `<td class="num">${c.error ? esc(c.error) : g3(c.max_abs)}</td><td>${esc(tolerance(c.tolerance))}</td>`
        + `<td class="ok">${c.ok ? 'pass' : 'FAIL'}</td><td class="num">${c.median_ms === null ? '' : c.median_ms.toFixed(1)}</td></tr>`);
    }
  }
  const table = document.createElement('table');
  table.id = 'results';
  table.innerHTML = '<tr><th>artifact</th><th>case</th><th>shape</th><th>max abs error</th><th>tolerance</th><th>pass</th>'
    + `<th>${result.repeats ? `ms (median of ${result.repeats})` : 'ms (not timed)'}</th></tr>${rows.join('')}`;
  document.body.append(table);
  const summary = $('summary');
  summary.textContent = `${result.passed} passed, ${result.failed} failed`
    + (result.not_loadable.length ? `; not loadable: ${result.not_loadable.map((a) => a.file).join(', ')}` : '');
  summary.className = result.failed || !result.passed ? 'fail' : 'pass';
}

async function main() {
  let ort;
  try {
    ort = await import(ORT_URL);
  } catch (e) {
    throw new Error(`cannot import ${ORT_URL} (${e.message}): run \`make web-build\` and serve the repo root (\`make web\`)`);
  }
  ort.env.wasm.numThreads = 1;  // no SharedArrayBuffer needed, so no COOP/COEP headers
  ort.env.logLevel = 'error';
  $('info').textContent = `artifact ${base.pathname}, onnxruntime-web ${ort.env.versions.web} (wasm, ${ort.env.wasm.numThreads} thread)`;
  const t0 = performance.now();
  const result = await checkArtifacts(ort, io, { repeats });
  if (result.name === 'seed') {  // the tutorial's printout: the first row of context for its six tokens
    result.book_row = await bookRow(ort, io);
    $('book').textContent = `tutorial input "Your journey starts with one step" (batch 2) through mha.onnx: context[0, 0, :] = `
      + result.book_row.map((v) => v.toFixed(4)).join(' ');
  }
  result.host = navigator.userAgent;
  result.artifact_dir = base.pathname;
  result.total_ms = performance.now() - t0;
  render(result);
  return result;
}

main().then((result) => { window.mhaResult = result; }, (e) => {
  const message = String((e && e.message) || e).split('\n')[0];
  $('error').textContent = `error: ${message}`;
  window.mhaResult = { error: message };
}).finally(() => { document.body.dataset.done = '1'; });
