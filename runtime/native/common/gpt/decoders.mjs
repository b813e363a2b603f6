// The two decoder forms, batch 1 (runtime/native/common/gpt.mjs re-exports them): prefill(ids) -> Float32Array [V] of
// the last token, step(id) -> the next; gpt.onnx (a Concat-grown cache) and gpt.inplace.onnx (one buffer per layer
// and key/value), over the caller's `ort` (onnxruntime-node or onnxruntime-web).
import { ArtifactError, ContractError, CONCAT_FORM, INPLACE_FORM, firstLine } from './base.mjs';
import { cacheRows, checkContract, formKind } from './folder.mjs';

const int64 = (ort, ids) => new ort.Tensor('int64', BigInt64Array.from(ids, (v) => BigInt(v)), [1, ids.length]);

function runtimeError(where, e) {
  return new ArtifactError(`${where}: ONNX Runtime failed (${firstLine(e)})`);
}

// Every shape is the manifest's contract.shapes (`shapes`): KV its kv_heads (fewer than the query heads under
// grouped-query attention), D its head_dim, C its context_length, V its vocab_size.

// gpt.onnx: past_key_values.{i}.* [1, KV, P, D] in, present.{i}.* [1, KV, P + T, D] out (fed to the next step),
// attention_mask all ones and position_ids P .. P + T - 1.
export class ConcatDecoder {
  constructor(ort, session, shapes, where = CONCAT_FORM) {
    Object.assign(this, { ort, session, shapes, where, length: 0, past: null });
  }

  async run(ids) {
    const { ort, shapes } = this;
    const p = this.length, t = ids.length;
    const feeds = {
      input_ids: int64(ort, ids),
      attention_mask: new ort.Tensor('int64', new BigInt64Array(p + t).fill(1n), [1, p + t]),
      position_ids: new ort.Tensor('int64', BigInt64Array.from({ length: t }, (_, i) => BigInt(p + i)), [1, t]),
    };
    const empty = new ort.Tensor('float32', new Float32Array(0), [1, shapes.kv_heads, 0, shapes.head_dim]);
    for (let i = 0; i < shapes.n_layers; i++) {
      feeds[`past_key_values.${i}.key`] = this.past ? this.past[`present.${i}.key`] : empty;
      feeds[`past_key_values.${i}.value`] = this.past ? this.past[`present.${i}.value`] : empty;
    }
    let out;
    try {
      out = await this.session.run(feeds);
    } catch (e) {
      throw runtimeError(this.where, e);
    }
    this.past = out;
    this.length = p + t;
    const v = shapes.vocab_size;
    return out.logits.data.slice((t - 1) * v, t * v);
  }

  async prefill(ids) { this.length = 0; this.past = null; return this.run(ids); }

  async step(token) { return this.run([token]); }
}

// gpt.inplace.onnx: one [1, KV, C, D] buffer per layer and key/value, zeroed, fed as past_key_values.{i}.* with
// past_tokens = the tokens already in it (C: context_length, or the layer's window where it keeps only that,
// contract.shapes.cache_lengths: after P tokens its rows 0 .. min(P, C) - 1 hold the last min(P, C) positions). alias: true (onnxruntime-node) passes the same tensors as the preallocated
// present.{i}.* outputs, so GroupQueryAttention writes only the new rows into them, in place; the first run checks
// that the rows landed there. alias: false (onnxruntime-web: its wasm backend copies tensors into its own memory and
// leaves preallocated outputs unwritten) feeds each run's present.{i}.* back as the next run's past.
export class InPlaceDecoder {
  constructor(ort, session, shapes, { alias, where = INPLACE_FORM } = {}) {
    Object.assign(this, { ort, session, shapes, where, alias: Boolean(alias), length: 0, checked: false });
    const { kv_heads: h, head_dim: d, n_layers: layers, vocab_size: v } = shapes;
    this.rows = {};
    this.buffers = {};
    cacheRows(shapes).forEach((c, i) => {
      for (const kv of ['key', 'value']) {
        this.rows[`${i}.${kv}`] = c;
        this.buffers[`${i}.${kv}`] = new ort.Tensor('float32', new Float32Array(h * c * d), [1, h, c, d]);
      }
    });
    this.logits = new ort.Tensor('float32', new Float32Array(v), [1, v]);
  }

  async run(ids) {
    const { ort, shapes } = this;
    const p = this.length, t = ids.length;
    if (p + t > shapes.context_length) throw new ContractError(`input_ids: ${p + t} tokens, longer than context_length ${shapes.context_length}`);
    const feeds = { input_ids: int64(ort, ids), past_tokens: new ort.Tensor('int32', Int32Array.of(p), [1]) };
    const fetches = this.alias ? { next_token_logits: this.logits } : undefined;
    for (const [name, buffer] of Object.entries(this.buffers)) {
      feeds[`past_key_values.${name}`] = buffer;
      if (this.alias) fetches[`present.${name}`] = buffer;
    }
    let out;
    try {
      out = fetches ? await this.session.run(feeds, fetches) : await this.session.run(feeds);
    } catch (e) {
      throw runtimeError(this.where, e);
    }
    if (this.alias && !this.checked) {  // the new rows of every buffer are the ones the run returned
      const { kv_heads: h, head_dim: d } = shapes;
      for (const name of Object.keys(this.buffers)) {
        const mine = this.buffers[name].data, theirs = out[`present.${name}`].data;
        const c = this.rows[name], resident = Math.min(p + t, c), fresh = Math.min(t, resident);
        for (let head = 0; head < h; head++) {
          const from = (head * c + resident - fresh) * d, to = from + fresh * d;
          for (let k = from; k < to; k++) {
            if (!Object.is(mine[k], theirs[k])) {
              throw new ArtifactError(`${this.where}: expected ONNX Runtime to write present.${name} into the buffer bound as `
                + 'its past (the in-place cache), it wrote elsewhere');
            }
          }
        }
      }
      this.checked = true;
    }
    if (!this.alias) for (const name of Object.keys(this.buffers)) this.buffers[name] = out[`present.${name}`];
    this.length = p + t;
    return Float32Array.from(out.next_token_logits.data);
  }

  async prefill(ids) { this.length = 0; return this.run(ids); }

  async step(token) { return this.run([token]); }
}

export function makeDecoder(ort, session, manifest, form, { alias = false } = {}) {
  checkContract(session, manifest, form);
  return formKind(form) === 'inplace' ? new InPlaceDecoder(ort, session, manifest.shapes, { alias, where: form })
    : new ConcatDecoder(ort, session, manifest.shapes, form);
}
