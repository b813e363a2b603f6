#!/usr/bin/env node
// node runtime/native/web/check.mjs ARTIFACT_DIR [--json FILE] [--repeats N]
// Every golden case of every artifact onnxruntime-web's WebAssembly backend can load, on one thread, with each
// artifact's tolerance; an artifact it cannot load is listed with the runtime's reason and counted neither way.
// One line per case (with the median milliseconds of N timed runs), ending with "N passed, N failed".
// --json FILE writes the same results (pass counts, max errors, median ms per case) for the README's portability
// table and `mha bench`, with "runtime": "wasm": the format the other runners' `check DIR --json FILE` write too
// (runtime/native/common/report.h).
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { ArtifactError, checkArtifacts } from './core.mjs';

const USAGE = 'usage: node check.mjs ARTIFACT_DIR [--json FILE] [--repeats N]';

function parseArgs(argv) {
  const opts = { dir: null, json: null, repeats: 3 };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === '--json' && i + 1 < argv.length) opts.json = argv[++i];
    else if (a === '--repeats' && i + 1 < argv.length) {
      opts.repeats = Number(argv[++i]);
      if (!Number.isInteger(opts.repeats) || opts.repeats < 1) return null;
    } else if (!a.startsWith('--') && opts.dir === null) opts.dir = a;
    else return null;
  }
  return opts.dir === null ? null : opts;
}

function nodeIo(dir) {
  const read = (rel, what) => {
    const file = path.join(dir, rel);
    if (!fs.existsSync(file)) {
      throw new ArtifactError(what ? `${file}: expected ${what}, found none` : `${file}: listed but missing`);
    }
    return fs.readFileSync(file);
  };
  return {
    where: dir,
    bytes: async (rel) => new Uint8Array(read(rel)),
    json: async (rel, what) => {
      try {
        return JSON.parse(read(rel, what).toString('utf8'));
      } catch (e) {
        if (e instanceof ArtifactError) throw e;
        throw new ArtifactError(`${path.join(dir, rel)}: expected JSON, got a parse error (${e.message})`);
      }
    },
    sha256: async (bytes) => crypto.createHash('sha256').update(bytes).digest('hex'),
  };
}

async function main(argv) {
  const opts = parseArgs(argv);
  if (!opts) {
    console.error(USAGE);
    return 2;
  }
  if (!fs.existsSync(opts.dir) || !fs.statSync(opts.dir).isDirectory()) {
    throw new ArtifactError(`artifact folder ${opts.dir}: expected a folder made by \`mha export\`, found none`);
  }
  let ort;
  try {
    ort = (await import('onnxruntime-web')).default;
  } catch {
    throw new Error('onnxruntime-web is not installed: run `make web-build` (npm ci in runtime/native/web)');
  }
  ort.env.wasm.numThreads = 1;  // Node's default is up to 4 worker threads
  ort.env.logLevel = 'error';
  const t0 = performance.now();
  const result = await checkArtifacts(ort, nodeIo(opts.dir), { repeats: opts.repeats, onLine: (l) => console.log(l) });
  result.host = `node ${process.version}`;
  result.artifact_dir = opts.dir;
  result.total_ms = performance.now() - t0;
  if (opts.json) {
    fs.mkdirSync(path.dirname(path.resolve(opts.json)), { recursive: true });
    fs.writeFileSync(`${opts.json}.tmp`, `${JSON.stringify(result, null, 1)}\n`);
    fs.renameSync(`${opts.json}.tmp`, opts.json);
  }
  console.log(`onnxruntime-web ${result.onnxruntime_web} wasm, ${result.threads} thread; `
    + `${result.not_loadable.length} artifact(s) not loadable${result.not_loadable.map((a) => `: ${a.file}`).join(',')}`);
  console.log(`${result.passed} passed, ${result.failed} failed`);
  if (result.passed + result.failed === 0) console.error(`error: ${opts.dir}: no case ran (nothing onnxruntime-web can load in golden/cases.json)`);
  return result.failed > 0 || result.passed === 0 ? 1 : 0;
}

main(process.argv.slice(2)).then((code) => process.exit(code), (e) => {
  console.error(`error: ${String(e && e.message || e).split('\n')[0]}`);
  process.exit(1);
});
