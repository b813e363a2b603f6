#!/usr/bin/env bash
# Install onnxruntime-web and playwright-core, pinned in package.json and package-lock.json (npm ci: exactly the lock).
# Neither downloads anything at install time: onnxruntime-web ships its .wasm files in the package, and
# playwright-core (unlike `playwright`) fetches no browser; the tests drive Debian's /usr/bin/chromium.
set -euo pipefail
cd "$(dirname "$0")"
command -v node >/dev/null || { echo "error: node not found (Node.js >= 20 is needed for the web runner)" >&2; exit 1; }
command -v npm >/dev/null || { echo "error: npm not found" >&2; exit 1; }
npm ci --no-audit --no-fund --loglevel=error
node --input-type=module -e "
import ort from 'onnxruntime-web'; import pw from 'playwright-core/package.json' with { type: 'json' };
console.log('onnxruntime-web', ort.env.versions.web, '+ playwright-core', pw.version, 'ready');"
