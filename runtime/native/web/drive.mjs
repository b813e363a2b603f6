#!/usr/bin/env node
// node runtime/native/web/drive.mjs URL --screenshot FILE.png [--json FILE] [--timeout SECONDS] [--chromium PATH]
// Opens the page (index.html?artifact=...) in headless Debian chromium driven by playwright-core (no browser download),
// waits until it is done, saves a full-page screenshot and prints the page's result as JSON (or writes it to --json).
// Exit 0 when the page finished with every case passed, 1 otherwise (one line on stderr saying why).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const USAGE = 'usage: node drive.mjs URL --screenshot FILE.png [--json FILE] [--timeout SECONDS] [--chromium PATH]';
const FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync'];

function parseArgs(argv) {
  const opts = { url: null, screenshot: null, json: null, timeout: 300, chromium: '/usr/bin/chromium' };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i], next = argv[i + 1];
    if (a === '--screenshot' && next) opts.screenshot = argv[++i];
    else if (a === '--json' && next) opts.json = argv[++i];
    else if (a === '--chromium' && next) opts.chromium = argv[++i];
    else if (a === '--timeout' && next) opts.timeout = Number(argv[++i]);
    else if (!a.startsWith('--') && opts.url === null) opts.url = a;
    else return null;
  }
  return opts.url && opts.screenshot && opts.timeout > 0 ? opts : null;
}

function writeAtomic(file, data) {
  fs.mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
  fs.writeFileSync(`${file}.tmp`, data);
  fs.renameSync(`${file}.tmp`, file);
}

async function main(argv) {
  const opts = parseArgs(argv);
  if (!opts) {
    console.error(USAGE);
    return 2;
  }
  if (!fs.existsSync(opts.chromium)) throw new Error(`${opts.chromium}: no chromium there (make chromium installs Debian's)`);
  const { chromium } = await import('playwright-core');
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'mha-web-chromium-'));  // a fresh --user-data-dir
  const log = [];
  let context = null;
  const t0 = performance.now();
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: opts.chromium, headless: true, args: FLAGS, timeout: 60_000,
      viewport: { width: 1100, height: 800 },
    });
    const page = context.pages()[0] || await context.newPage();
    page.on('pageerror', (e) => log.push(`pageerror: ${e.message}`));
    page.on('requestfailed', (r) => log.push(`requestfailed: ${r.url()} ${r.failure()?.errorText}`));
    page.on('console', (m) => { if (m.type() === 'error') log.push(`console: ${m.text()}`); });
    await page.goto(opts.url, { timeout: 60_000 });
    await page.waitForSelector('body[data-done="1"]', { timeout: opts.timeout * 1000 });
    const result = await page.evaluate(() => window.mhaResult);
    writeAtomic(opts.screenshot, await page.screenshot({ fullPage: true }));
    const doc = { url: opts.url, browser: context.browser()?.version() ?? null, profile, page_ms: performance.now() - t0,
      log, ...result };
    const text = `${JSON.stringify(doc, null, 1)}\n`;
    if (opts.json) writeAtomic(opts.json, text);
    else process.stdout.write(text);
    if (result.error) throw new Error(`the page reports: ${result.error}`);
    console.error(`${result.name}: ${result.passed} passed, ${result.failed} failed in the browser; screenshot ${opts.screenshot}`);
    return result.failed > 0 || result.passed === 0 ? 1 : 0;
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
