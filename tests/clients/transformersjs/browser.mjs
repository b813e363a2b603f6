#!/usr/bin/env node
// node tests/clients/transformersjs/browser.mjs URL [--timeout SECONDS] [--chromium PATH]
// Opens browser.html (URL) in headless Debian chromium driven by playwright-core (runtime/native/web/node_modules,
// `make web-build`; no browser download), waits for body[data-done="1"] (or the deadline) and prints one JSON line:
// {browser, result: window.mhaResult, requests: [every URL the page asked for], log: [page errors, failed requests,
// console errors]}. Exit 0 when the page finished (the test judges its result), 1 otherwise (one line on stderr).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const PLAYWRIGHT = path.join(REPO, 'runtime', 'native', 'web', 'node_modules', 'playwright-core', 'index.mjs');
// As runtime/native/web/drive.mjs: no GPU, no network but the page's own server.
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

function parseArgs(argv) {
  const opts = { url: null, timeout: 90, chromium: '/usr/bin/chromium' };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i], next = argv[i + 1];
    if (a === '--timeout' && next) opts.timeout = Number(argv[++i]);
    else if (a === '--chromium' && next) opts.chromium = argv[++i];
    else if (!a.startsWith('--') && opts.url === null) opts.url = a;
    else return null;
  }
  return opts.url && opts.timeout > 0 ? opts : null;
}

async function main(argv) {
  const opts = parseArgs(argv);
  if (!opts) throw new Error('usage: node browser.mjs URL [--timeout SECONDS] [--chromium PATH]');
  if (!fs.existsSync(opts.chromium)) throw new Error(`${opts.chromium}: no chromium there (make chromium)`);
  if (!fs.existsSync(PLAYWRIGHT)) throw new Error(`${PLAYWRIGHT} is missing (make web-build)`);
  const { chromium } = await import(pathToFileURL(PLAYWRIGHT).href);
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'mha-tjs-chromium-')); // a fresh profile: nothing cached
  const requests = [];
  const log = [];
  let context = null;
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: opts.chromium, headless: true, args: FLAGS, timeout: 60_000,
    });
    const page = context.pages()[0] || await context.newPage();
    context.on('request', (r) => requests.push(r.url())); // the context's: a worker's fetches too
    page.on('pageerror', (e) => log.push(`pageerror: ${e.message}`));
    page.on('requestfailed', (r) => log.push(`requestfailed: ${r.url()} ${r.failure()?.errorText}`));
    page.on('console', (m) => { if (m.type() === 'error') log.push(`console: ${m.text()}`); });
    await page.goto(opts.url, { timeout: 60_000 });
    await page.waitForSelector('body[data-done="1"]', { timeout: opts.timeout * 1000 });
    const result = await page.evaluate(() => window.mhaResult);
    const browser = context.browser()?.version() ?? null;
    process.stdout.write(`${JSON.stringify({ browser, result, requests, log })}\n`);
    return 0;
  } catch (e) {
    const extra = log.length ? ` (${log[0]})` : '';
    throw new Error(`${String(e && e.message || e).split('\n')[0]}${extra}`);
  } finally {
    if (context) await context.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

main(process.argv.slice(2)).then((code) => process.exit(code), (e) => {
  console.error(`error: ${String(e && e.message || e).split('\n')[0]}`);
  process.exit(1);
});
