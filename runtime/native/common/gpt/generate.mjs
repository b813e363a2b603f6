// One generation (runtime/native/common/gpt.mjs re-exports it): the request's checks, prefill, then a step per token
// with the sampling rule (sampling.mjs) until the stop rule (max_new_tokens, eos, context_length) says so.
import { ContractError } from './base.mjs';
import { Sampler, checkSampling } from './sampling.mjs';

// The ids a generation stops at: eosId is one id, a list of them (a folder's stop_ids) or null. As Python's stop_set.
export function stopIds(eosId) {
  return eosId === null || eosId === undefined ? [] : Array.isArray(eosId) ? eosId : [eosId];
}

// The rule of `mha inspect` and every runner: 1 <= prompt + new tokens <= context_length, so a prompt leaves room for
// one new token (a prompt of context_length tokens got one new token at position context_length + 1).
export function checkPrompt(prompt, shapes) {
  if (!Array.isArray(prompt) || !prompt.length) throw new ContractError('prompt: expected at least one token id, got an empty prompt');
  const bad = prompt.find((t) => !Number.isInteger(t));
  if (bad !== undefined) throw new ContractError(`prompt: expected integer token ids, got ${JSON.stringify(bad)}`);
  const out = prompt.find((t) => t < 0 || t >= shapes.vocab_size);
  if (out !== undefined) throw new ContractError(`prompt: token id ${out} is outside the vocabulary (0..${shapes.vocab_size - 1})`);
  if (prompt.length > shapes.context_length) {
    throw new ContractError(`prompt: ${prompt.length} tokens, longer than context_length ${shapes.context_length}`);
  }
  if (prompt.length === shapes.context_length) {
    throw new ContractError(`prompt: ${prompt.length} tokens fill context_length ${shapes.context_length}, leaving no room for a new token; give at most ${shapes.context_length - 1}`);
  }
}

export function checkRequest(prompt, shapes, { maxNewTokens, temperature = 0, topK = null, eosId = null }) {
  checkPrompt(prompt, shapes);
  if (!Number.isInteger(maxNewTokens) || maxNewTokens < 1) throw new ContractError(`max_new_tokens: expected an integer >= 1, got ${JSON.stringify(maxNewTokens)}`);
  checkSampling(temperature, topK, shapes.vocab_size);
  const bad = stopIds(eosId).find((i) => !Number.isInteger(i) || i < 0 || i >= shapes.vocab_size);
  if (bad !== undefined) throw new ContractError(`eos_id: expected token ids below ${shapes.vocab_size}, got ${bad}`);
}

// Append the next token unless it is an eos id; why the generation stops now ('' if it goes on). As Python's take_token.
export function takeToken(ids, token, { promptTokens, maxNewTokens, eosId, contextLength }) {
  if (stopIds(eosId).includes(token)) return 'eos';
  ids.push(token);
  if (ids.length >= maxNewTokens) return 'max_new_tokens';
  if (promptTokens + ids.length >= contextLength) return 'context_length';
  return '';
}

const clock = () => (globalThis.performance ? performance.now() : Date.now());

// One generation: prefill, then a step per token. onToken(id) after each new id (awaited: the page paints there).
// Returns { ids, stop, seed (a decimal string), first_logits, time_to_first_token_s, seconds, tokens_per_s } where
// tokens_per_s counts the tokens after the first over the time after it (the decode speed, as Python's).
export async function generate(decoder, prompt, { maxNewTokens, temperature = 0, topK = null, seed = null, eosId = null,
  onToken = null, now = clock } = {}) {
  const { shapes } = decoder;
  checkRequest(prompt, shapes, { maxNewTokens, temperature, topK, eosId });
  const sampler = new Sampler({ temperature, topK, seed, vocabSize: shapes.vocab_size });
  const ids = [];
  const t0 = now();
  let logits = await decoder.prefill(prompt);
  const firstLogits = logits;
  let ttft = null, stop = '';
  for (;;) {
    const token = sampler.next(logits);
    stop = takeToken(ids, token, { promptTokens: prompt.length, maxNewTokens, eosId, contextLength: shapes.context_length });
    if (ttft === null) ttft = (now() - t0) / 1000;
    if (stop !== 'eos' && onToken) await onToken(token);
    if (stop) break;
    logits = await decoder.step(token);
  }
  const seconds = (now() - t0) / 1000;
  const later = ids.length - (ids.length ? 1 : 0);
  return { ids, stop, seed: String(sampler.seed), first_logits: firstLogits, time_to_first_token_s: ttft, seconds,
    tokens_per_s: seconds > ttft && later > 0 ? later / (seconds - ttft) : 0 };
}
