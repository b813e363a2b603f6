#!/usr/bin/env bash
# Install onnxruntime-node (pinned in package.json / package-lock.json). ONNXRUNTIME_NODE_INSTALL=skip stops its
# install script from trying to download GPU parts; the CPU binary ships inside the npm package.
set -euo pipefail
cd "$(dirname "$0")"
command -v node >/dev/null || { echo "error: node not found (Node.js >= 18 is needed for the Node runner)" >&2; exit 1; }
command -v npm >/dev/null || { echo "error: npm not found" >&2; exit 1; }
ONNXRUNTIME_NODE_INSTALL=skip npm ci --no-audit --no-fund --loglevel=error
node -e "require('onnxruntime-node'); console.log('onnxruntime-node', require('onnxruntime-node/package.json').version, 'ready')"
