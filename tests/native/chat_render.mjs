// node tests/native/chat_render.mjs DIR PACKAGE_DIR REQUEST.json: what runtime/native/common/gpt/chat.mjs renders
// with the @huggingface/jinja and @huggingface/tokenizers installed in PACKAGE_DIR (runtime/native/node or web), for
// tests/native/test_chat_js.py. REQUEST: {"conversations": [[messages]...], "templates": {name: source}}. Prints
// {"folder": [{"text", "ids"}...] (the folder's own template), "templates": {name: [text...]}, "stop_ids": [...]}.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [dir, pkg, requestFile] = process.argv.slice(2);
const here = path.dirname(new URL(import.meta.url).pathname);
const gpt = await import(pathToFileURL(path.join(here, '..', '..', 'runtime', 'native', 'common', 'gpt.mjs')));
const modules = path.join(pkg, 'node_modules', '@huggingface');
const { Template } = await import(pathToFileURL(path.join(modules, 'jinja', 'dist', 'index.js')));
const { Tokenizer } = await import(pathToFileURL(path.join(modules, 'tokenizers', 'dist', 'tokenizers.mjs')));
const request = JSON.parse(fs.readFileSync(requestFile, 'utf8'));
const io = {
  where: dir,
  bytes: async (rel) => new Uint8Array(fs.readFileSync(path.join(dir, rel))),
  sha256: async (bytes) => crypto.createHash('sha256').update(bytes).digest('hex'),
};
const manifest = await gpt.readGptManifest(io);
const tokenizer = await gpt.loadTokenizer(io, manifest, Tokenizer);
const chat = await gpt.loadChat(io, manifest, tokenizer, Template);
const folder = request.conversations.map((m) => ({ text: chat.render(m), ids: chat.encode(m) }));
const templates = Object.fromEntries(Object.entries(request.templates).map(([name, source]) => {
  const template = gpt.compileTemplate(Template, source);
  return [name, request.conversations.map((m) => gpt.renderChat(template, gpt.checkMessages(m), chat.tokens))];
}));
console.log(JSON.stringify({ folder, templates, stop_ids: chat.stopIds }));
