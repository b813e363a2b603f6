// The GPT page's chat box (gpt-page.mjs shows it only for a folder with a chat template): the conversation so far
// (an optional system message, then user and assistant turns) rendered with the folder's template
// (runtime/native/common/gpt/chat.mjs, @huggingface/jinja), each reply streamed and ending at the template's end of
// turn, then kept in the conversation as the assistant's message. Every turn is recorded for the result: the
// messages it rendered, the rendered text, its ids and the reply's ids, stop and text.
import * as gpt from '../common/gpt.mjs';

const $ = (id) => document.getElementById(id);

// Wire the box to `chat` (loadChat's) on `decoder`; settings() gives the sampling controls' values, paint() lets the
// browser draw. -> send(text): one turn, resolved with its record (also pushed to the returned turns list).
export function chatBox({ chat, decoder, tokenizer, settings, paint }) {
  const messages = [];
  const turns = [];
  $('chat-panel').hidden = false;

  const bubble = (role, text) => {
    const div = document.createElement('div');
    div.className = `turn ${role}`;
    div.textContent = text;
    $('conversation').append(div);
    return div;
  };

  const send = async (text) => {
    $('chat-error').textContent = '';
    $('send').disabled = true;
    try {
      const system = $('system').value.trim();
      if (!messages.length && system) messages.push({ role: 'system', content: system });
      const asked = [...messages, { role: 'user', content: text }];
      const rendered = chat.render(asked);
      const ids = tokenizer.encode(rendered, false);  // the template writes its special tokens (no second BOS)
      messages.push(asked[asked.length - 1]);
      bubble('user', text);
      const reply = bubble('assistant', '');
      const stream = new gpt.TextStream(tokenizer);
      const { maxNewTokens, temperature, topK, seed } = settings();
      const r = await gpt.generate(decoder, ids, {
        maxNewTokens, temperature, topK, seed, eosId: chat.stopIds,
        onToken: async (token) => { reply.textContent += stream.push(token); await paint(); },
      });
      reply.textContent += stream.end();
      messages.push({ role: 'assistant', content: reply.textContent });
      $('chat-stats').textContent = `${r.ids.length} tokens, time to first token ${(r.time_to_first_token_s * 1e3).toFixed(1)} ms, `
        + `${r.tokens_per_s.toFixed(1)} tokens/s (stopped: ${r.stop.replaceAll('_', ' ')})`;
      const turn = { messages: asked, rendered, prompt_ids: ids, ids: r.ids, stop: r.stop, text: reply.textContent,
        stop_ids: chat.stopIds };
      turns.push(turn);
      return turn;
    } catch (e) {
      $('chat-error').textContent = `error: ${String((e && e.message) || e).split('\n')[0]}`;
      throw e;
    } finally {
      $('send').disabled = false;
    }
  };

  $('send').addEventListener('click', () => {
    const text = $('message').value.trim();
    if (!text) return;
    $('message').value = '';
    send(text).catch(() => {});
  });
  $('send').disabled = false;
  return { send, turns };
}
