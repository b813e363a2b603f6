'use strict';
// Reading a file the runner was pointed at: a regular file only, checked by stat before a byte is read, so that
// /dev/zero, a FIFO or a folder in its place is one line (reading one took all memory, or blocked for a writer);
// and writing a result file (the Node runner's and web/check.mjs's).
const crypto = require('crypto');
const fs = require('fs');
const path = require('path');

function kindOf(st) {
  if (st.isDirectory()) return 'a folder';
  if (st.isFIFO()) return 'a FIFO (named pipe)';
  if (st.isCharacterDevice()) return 'a character device';
  if (st.isBlockDevice()) return 'a block device';
  if (st.isSocket()) return 'a socket';
  return 'not a regular file';
}

// The bytes of `file`, a regular file of at most `limit` bytes; otherwise the error made by `error(message)`.
// A missing file throws fs's own error (code ENOENT) for the caller to word.
function readRegular(file, limit, error) {
  const st = fs.statSync(file);
  if (!st.isFile()) throw error(`${file}: expected a regular file, got ${kindOf(st)}`);
  if (st.size > limit) throw error(`${file}: expected at most ${limit} bytes, got ${st.size}`);
  return fs.readFileSync(file);
}

// The size of `file` if it is a regular file, else null (missing, or of another kind: the read says which), so
// that a listed file of another size than the manifest's is refused without being read.
function regularSize(file) {
  try {
    const st = fs.statSync(file);
    return st.isFile() ? st.size : null;
  } catch {
    return null;
  }
}

// A manifest is a few KB: a larger file is not one (and is not read whole), as in the Python and C readers.
const MAX_MANIFEST_BYTES = 4 << 20;

// Writing a result: under a name unique to this process (pid + random suffix), renamed into place, so that concurrent
// runs on one output path never see each other's half-written files and a failed write leaves nothing behind.
function writeAtomically(output, bytes) {
  const tmp = `${output}.${process.pid}.${crypto.randomBytes(6).toString('hex')}.tmp`;
  try {
    fs.writeFileSync(tmp, bytes, { flag: 'wx' });  // 'wx': never reuse a file that is already there
    fs.renameSync(tmp, output);
  } catch (e) {
    fs.rmSync(tmp, { force: true });
    throw new Error(`${output}: cannot write it (${e.code || e.message})`);
  }
}

// doc as JSON to file, atomically, its folder made first (the Node runner's and web/check.mjs's --json).
function writeJson(file, doc) {
  const dir = path.dirname(path.resolve(file));
  try {
    fs.mkdirSync(dir, { recursive: true });
  } catch (e) {
    throw new Error(`${dir}: cannot make the folder (${e.code || e.message})`);
  }
  writeAtomically(file, `${JSON.stringify(doc, null, 1)}\n`);
}

module.exports = { MAX_MANIFEST_BYTES, readRegular, regularSize, writeAtomically, writeJson };
