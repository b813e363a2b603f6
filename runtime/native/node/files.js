'use strict';
// Reading a file the runner was pointed at: a regular file only, checked by stat before a byte is read, so that
// /dev/zero, a FIFO or a folder in its place is one line (reading one took all memory, or blocked for a writer);
// and writing a result file (the Node runner's and web/check.mjs's); and the bytes of a text argument.
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
// A FIFO or a device (/dev/stdout, /dev/full) is written through, never replaced, as the Python and C runners write
// it: the rename made a regular file of the device, for a user who may write in /dev.
function writeAtomically(output, bytes) {
  let stat = null;
  try {
    stat = fs.statSync(output);
  } catch {
    // nothing there yet: the usual temporary file and rename
  }
  if (stat && !stat.isFile() && !stat.isDirectory()) {
    try {
      fs.writeFileSync(output, bytes);
    } catch (e) {
      throw new Error(`${output}: cannot write it (${e.code || e.message})`);
    }
    return;
  }
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

// The value after `flag` in argv (process.argv.slice(2)) when the shell passed bytes there that are not UTF-8:
// Node decodes argv with every invalid byte made U+FFFD, so 'ab\xffcd' silently became the text 'ab\ufffdcd' where
// `mha generate` refuses it (Python's surrogateescape). The bytes come from Linux's /proc/self/cmdline; where it
// cannot be read, or its tail is not argv, nothing is checked.
function checkUtf8Arg(argv, flag, error) {
  let raw;
  try {
    raw = fs.readFileSync('/proc/self/cmdline');
  } catch {
    return;
  }
  const args = [];
  for (let start = 0; start < raw.length;) {
    const end = raw.indexOf(0, start);
    args.push(raw.subarray(start, end < 0 ? raw.length : end));
    start = end < 0 ? raw.length : end + 1;
  }
  const tail = args.slice(args.length - argv.length);
  if (tail.length !== argv.length || tail.some((b, i) => b.toString('utf8') !== argv[i])) return;
  argv.forEach((a, i) => {
    if (a !== flag || i + 1 >= argv.length || !argv[i + 1].includes('\ufffd')) return;
    // the bytes before the first invalid one decode to themselves: the first U+FFFD whose bytes are not EF BF BD
    // (U+FFFD itself) is where they are
    const text = argv[i + 1], bytes = tail[i + 1];
    for (let c = text.indexOf('\ufffd'); c >= 0; c = text.indexOf('\ufffd', c + 1)) {
      const at = Buffer.byteLength(text.slice(0, c));
      if (bytes[at] === 0xef && bytes[at + 1] === 0xbf && bytes[at + 2] === 0xbd) continue;
      throw error(`${flag.slice(2)}: expected text (valid Unicode), got the byte 0x${bytes[at].toString(16)}, `
        + `not UTF-8, at byte ${at}`);
    }
  });
}

// stdout closed by its reader (`mha-node generate ... --text | head -c 1`): exit 1 at once and quietly, as `mha
// generate` does (click's rule); the write's EPIPE was an unhandled 'error' event, a stack trace on stderr, or (the
// wasm runner) went unseen while the whole generation ran on and exited 0. Another stdout error (ENOSPC of
// /dev/full) is one line, exit 1.
function exitOnClosedStdout() {
  process.stdout.on('error', (e) => {
    if (e.code !== 'EPIPE') process.stderr.write(`error: stdout: cannot write (${e.code || e.message})\n`);
    process.exit(1);
  });
}

// process.exit(code) once stdout has taken what was written: exiting at once dropped a last write's error (the ids
// of `generate` written to /dev/full exited 0; the stream reports it ticks later), which exitOnClosedStdout's
// handler now reports first.
function exitAfterStdout(code) {
  setImmediate(() => process.stdout.write('', () => process.exit(code)));
}

module.exports = {
  MAX_MANIFEST_BYTES, checkUtf8Arg, exitAfterStdout, exitOnClosedStdout, readRegular, regularSize, writeAtomically,
  writeJson,
};
