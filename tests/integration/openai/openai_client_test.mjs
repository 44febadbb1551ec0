// `cloister proxy` driven by the official `openai` npm package, as an app that speaks the OpenAI
// API would use it: only the base URL and the key differ. Run by openai_proxy_test.cc, which
// starts the real appliance (cloisterd + cloister-enclave) publishing the shared tiny LLM as
// "shared-tiny", uploads it as "tiny" and the BERT encoder as "bert", starts a proxy per tenant
// and passes, in the environment:
//   OPENAI_NODE_DIR   the folder holding node_modules/openai (install-openai.sh)
//   PROXY_URL         the base URL of tenant acme's proxy; PROXY_KEY its API key
//   SOLO_PROXY_URL    the proxy of tenant solo, whose cloisterd limit is one generation at once
//   METERED_PROXY_URL the proxy of tenant metered: a token bucket of 60, refilled 0.5 a second
//   REFERENCE_JSON    the tiny model's reference.json (greedy ids and text per prompt)
//   EMBEDDING_CASES   {"rows": [[ids]...], "expected": [[floats]...]} from the BERT test data
//   CANARY            a string to send inside prompts (the driver scans every log for it)
// Prints one line per check ("ok NAME" or "FAIL NAME: why") and exits 1 when any failed. It
// never prints a completion.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';

const env = (name) => {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
};
const require = createRequire(path.join(env('OPENAI_NODE_DIR'), 'package.json'));
const { OpenAI } = require('openai');

const reference = JSON.parse(readFileSync(env('REFERENCE_JSON'), 'utf8'));
const embeddingCases = JSON.parse(readFileSync(env('EMBEDDING_CASES'), 'utf8'));
const canary = env('CANARY');
const maxTokens = reference.generation.max_new_tokens;
const chatPrompts = reference.prompts.filter((p) => p.kind === 'chat');
const plainPrompts = reference.prompts.filter((p) => p.kind === 'plain');
assert.ok(chatPrompts.length > 0 && plainPrompts.length > 0);

const client = (url = env('PROXY_URL'), key = env('PROXY_KEY')) =>
  new OpenAI({ baseURL: url, apiKey: key, maxRetries: 0, timeout: 120_000 });
const acme = client();
const solo = client(env('SOLO_PROXY_URL'));
const metered = client(env('METERED_PROXY_URL'));

// The ids behind logprobs tokens ("token_id:N": the proxy holds no tokenizer).
const idsOf = (content) => content.map((entry) => {
  assert.match(entry.token, /^token_id:\d+$/);
  return Number(entry.token.slice('token_id:'.length));
});
const finishOf = (prompt) => (prompt.stop === 'eos' ? 'stop' : 'length');

// Expects `promise` to fail with an APIError of `status`, `code` and `param` (when given).
async function expectError(promise, { status, code, param, message }) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof OpenAI.APIError, `not an APIError: ${e}`);
    assert.equal(e.status, status, e.message);
    if (code !== undefined) assert.equal(e.code, code, e.message);
    if (param !== undefined) assert.equal(e.param, param, e.message);
    if (message !== undefined) assert.match(e.message, message);
    return e;
  }
  assert.fail(`expected an error with status ${status}`);
}

// Reads a streamed chat completion: its text, ids (from logprobs), finish reason, last event.
async function readChatStream(stream) {
  let text = '';
  const ids = [];
  let finish = null;
  let role = null;
  let last = null;
  let usage = null;
  for await (const event of stream) {
    assert.equal(event.object, 'chat.completion.chunk');
    last = event;
    if (event.usage) usage = event.usage;
    for (const choice of event.choices) {
      if (choice.delta.role) role = choice.delta.role;
      if (choice.delta.content) text += choice.delta.content;
      if (choice.logprobs?.content) ids.push(...idsOf(choice.logprobs.content));
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  return { text, ids, finish, role, last, usage };
}

const checks = [];
const check = (name, body) => checks.push({ name, body });

check('models lists the LLM, the encoder and the published model, with digests and the measurement', async () => {
  const page = await acme.models.list();
  const models = page.data;
  const tiny = models.find((m) => m.id === 'tiny');
  const bert = models.find((m) => m.id === 'bert');
  assert.ok(tiny && bert, JSON.stringify(models.map((m) => m.id)));
  assert.equal(tiny.object, 'model');
  assert.equal(tiny.owned_by, 'acme');
  assert.equal(typeof tiny.created, 'number');
  assert.equal(tiny.cloister.kind, 'llm');
  assert.match(tiny.cloister.digest, /^[0-9a-f]{64}$/);
  assert.match(tiny.cloister.measurement, /^[0-9a-f]{64,}$/);
  assert.equal(tiny.cloister.published, false);
  assert.deepEqual(tiny.cloister.endpoints, ['/v1/chat/completions', '/v1/completions']);
  assert.equal(bert.cloister.kind, 'onnx');
  assert.deepEqual(bert.cloister.endpoints, ['/v1/embeddings']);
  assert.equal(bert.cloister.measurement, tiny.cloister.measurement);
  // The operator's published copy of the same model, listed after the tenant's own.
  const shared = models.find((m) => m.id === 'shared-tiny');
  assert.ok(shared, 'no published model listed');
  assert.equal(shared.owned_by, 'operator');
  assert.equal(shared.cloister.published, true);
  assert.equal(shared.cloister.digest, tiny.cloister.digest);
  const reply = await acme.chat.completions.create({ model: 'shared-tiny',
    messages: chatPrompts[0].messages, temperature: 0, max_tokens: maxTokens });
  assert.equal(reply.choices[0].message.content, chatPrompts[0].generated_text);
  const one = await acme.models.retrieve('tiny');
  assert.equal(one.id, 'tiny');
  assert.equal(one.cloister.digest, tiny.cloister.digest);
  await expectError(acme.models.retrieve('no-such-model'), { status: 404, code: 'model_not_found' });
});

check('a chat completion at temperature 0 gives every chat reference exactly', async () => {
  for (const prompt of chatPrompts) {
    const completion = await acme.chat.completions.create({
      model: 'tiny', messages: prompt.messages, temperature: 0, max_tokens: maxTokens,
      logprobs: true, user: 'ignored-by-the-proxy',
    });
    assert.equal(completion.object, 'chat.completion');
    assert.match(completion.id, /^chatcmpl-/);
    assert.equal(completion.model, 'tiny');
    assert.equal(completion.choices.length, 1);
    const choice = completion.choices[0];
    assert.equal(choice.message.role, 'assistant');
    assert.equal(choice.message.content, prompt.generated_text, prompt.name);
    assert.deepEqual(idsOf(choice.logprobs.content), prompt.generated_ids, prompt.name);
    assert.equal(choice.finish_reason, finishOf(prompt), prompt.name);
    assert.equal(completion.usage.prompt_tokens, prompt.prompt_ids.length);
    assert.equal(completion.usage.completion_tokens, prompt.generated_ids.length);
    assert.equal(completion.usage.total_tokens,
      prompt.prompt_ids.length + prompt.generated_ids.length);
    assert.equal(typeof completion.usage.prompt_tokens_details.cached_tokens, 'number');
    assert.ok(completion.cloister.receipt.length > 0);
    assert.ok(Buffer.from(completion.cloister.receipt_signature, 'base64').length === 64);
  }
});

check('a streamed chat completion gives every chat reference, then usage and [DONE]', async () => {
  for (const prompt of chatPrompts) {
    const stream = await acme.chat.completions.create({
      model: 'tiny', messages: prompt.messages, temperature: 0, max_completion_tokens: maxTokens,
      stream: true, stream_options: { include_usage: true }, logprobs: true,
    });
    const read = await readChatStream(stream);
    assert.equal(read.role, 'assistant');
    assert.equal(read.text, prompt.generated_text, prompt.name);
    assert.deepEqual(read.ids, prompt.generated_ids, prompt.name);
    assert.equal(read.finish, finishOf(prompt));
    assert.deepEqual(read.last.choices, []);
    assert.equal(read.usage.completion_tokens, prompt.generated_ids.length);
    assert.ok(read.last.cloister.receipt.length > 0);
  }
  // Without logprobs and usage the text is the same; the receipt rides on the finish event.
  const prompt = chatPrompts[0];
  const read = await readChatStream(await acme.chat.completions.create({
    model: 'tiny', messages: prompt.messages, temperature: 0, max_tokens: maxTokens, stream: true,
  }));
  assert.equal(read.text, prompt.generated_text);
  assert.equal(read.usage, null);
  assert.equal(read.last.choices[0].finish_reason, 'stop');
  assert.ok(read.last.cloister.receipt.length > 0);
});

check('a completion gives every plain reference, from text or from token ids', async () => {
  for (const prompt of plainPrompts) {
    const completion = await acme.completions.create({
      model: 'tiny', prompt: prompt.text, temperature: 0, max_tokens: maxTokens,
    });
    assert.equal(completion.object, 'text_completion');
    assert.match(completion.id, /^cmpl-/);
    assert.equal(completion.choices[0].text, prompt.generated_text, prompt.name);
    assert.equal(completion.choices[0].finish_reason, finishOf(prompt), prompt.name);
    assert.equal(completion.usage.prompt_tokens, prompt.prompt_ids.length);
    assert.equal(completion.usage.completion_tokens, prompt.generated_ids.length);
  }
  const prompt = plainPrompts[0];
  const byIds = await acme.completions.create({
    model: 'tiny', prompt: prompt.prompt_ids, temperature: 0, max_tokens: maxTokens, logprobs: 2,
  });
  assert.equal(byIds.choices[0].text, prompt.generated_text);
  const logprobs = byIds.choices[0].logprobs;
  assert.deepEqual(logprobs.tokens.map((t) => Number(t.slice('token_id:'.length))),
    prompt.generated_ids);
  assert.equal(logprobs.token_logprobs.length, prompt.generated_ids.length);
  assert.equal(Object.keys(logprobs.top_logprobs[0]).length, 2);
  // Streamed.
  let text = '';
  let finish = null;
  for await (const event of await acme.completions.create({
    model: 'tiny', prompt: prompt.text, temperature: 0, max_tokens: maxTokens, stream: true,
  })) {
    assert.equal(event.object, 'text_completion');
    for (const choice of event.choices) {
      text += choice.text;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  assert.equal(text, prompt.generated_text);
  assert.equal(finish, finishOf(prompt));
  // OpenAI's default of 16 tokens for completions.
  const short = await acme.completions.create({ model: 'tiny', prompt: 'Hello', temperature: 0,
    ignore_eos: true });
  assert.equal(short.usage.completion_tokens, 16);
  assert.equal(short.choices[0].finish_reason, 'length');
});

check('embeddings match the reference sentence_embedding, as floats and as base64', async () => {
  const { rows, expected } = embeddingCases;
  const close = (actual, wanted, what) => {
    assert.equal(actual.length, wanted.length, what);
    for (let i = 0; i < wanted.length; ++i) {
      assert.ok(Math.abs(actual[i] - wanted[i]) <= 1e-4 + 1e-3 * Math.abs(wanted[i]),
        `${what}[${i}]: ${actual[i]} against ${wanted[i]}`);
    }
  };
  const floats = await acme.embeddings.create({ model: 'bert', input: rows,
    encoding_format: 'float' });
  assert.equal(floats.object, 'list');
  assert.equal(floats.model, 'bert');
  assert.equal(floats.data.length, rows.length);
  floats.data.forEach((d, i) => {
    assert.equal(d.object, 'embedding');
    assert.equal(d.index, i);
    close(d.embedding, expected[i], `row ${i}`);
  });
  const tokens = rows.reduce((n, r) => n + r.length, 0);
  assert.equal(floats.usage.prompt_tokens, tokens);
  // The client asks for base64 by default and decodes it itself.
  const decoded = await acme.embeddings.create({ model: 'bert', input: rows });
  decoded.data.forEach((d, i) => close(Array.from(d.embedding), expected[i], `base64 row ${i}`));
  // One row alone gives the same embedding as in the padded batch.
  const single = await acme.embeddings.create({ model: 'bert', input: rows[1],
    encoding_format: 'float' });
  close(single.data[0].embedding, expected[1], 'row 1 alone');
});

check('every error has OpenAI\'s shape and status', async () => {
  const messages = [{ role: 'user', content: 'Hi' }];
  await expectError(acme.chat.completions.create({ model: 'no-such-model', messages }),
    { status: 404, code: 'model_not_found', param: 'model' });
  await expectError(acme.completions.create({ model: 'no-such-model', prompt: 'x' }),
    { status: 404, code: 'model_not_found' });
  await expectError(acme.chat.completions.create({ model: 'no-such-model', messages,
    stream: true }), { status: 404, code: 'model_not_found' });
  await expectError(acme.embeddings.create({ model: 'no-such-model', input: [1, 2] }),
    { status: 404, code: 'model_not_found' });
  await expectError(acme.chat.completions.create({ model: 'tiny', messages, temperature: 5 }),
    { status: 400, param: 'temperature', message: /temperature must be/ });
  await expectError(acme.chat.completions.create({ model: 'tiny', messages, n: 2 }),
    { status: 400, param: 'n' });
  await expectError(acme.chat.completions.create({ model: 'tiny', messages,
    logit_bias: { 5: 10 } }), { status: 400, param: 'logit_bias' });
  await expectError(acme.chat.completions.create({ model: 'tiny',
    messages: [{ role: 'user', content: 7 }] }), { status: 400, param: 'messages[0].content' });
  await expectError(acme.embeddings.create({ model: 'bert', input: 'some text' }),
    { status: 400, param: 'input', message: /no tokenizer/ });
  await expectError(acme.embeddings.create({ model: 'tiny', input: [1, 2] }),
    { status: 400, param: 'model', message: /generative model/ });
  await expectError(acme.completions.create({ model: 'bert', prompt: 'x' }), { status: 400 });
  await expectError(client(env('PROXY_URL'), 'wrong-key').models.list(),
    { status: 401, code: 'invalid_api_key' });
});

check('eight streamed clients at once each get their reference', async () => {
  const prompts = [...chatPrompts, ...plainPrompts];
  const runs = Array.from({ length: 8 }, async (_, i) => {
    const prompt = prompts[i % prompts.length];
    const own = client();  // a client (and connection pool) each, like eight apps
    if (prompt.kind === 'chat') {
      const read = await readChatStream(await own.chat.completions.create({
        model: 'tiny', messages: prompt.messages, temperature: 0, max_tokens: maxTokens,
        stream: true, logprobs: true,
      }));
      assert.deepEqual(read.ids, prompt.generated_ids, `stream ${i}`);
      assert.equal(read.text, prompt.generated_text, `stream ${i}`);
    } else {
      let text = '';
      for await (const event of await own.completions.create({
        model: 'tiny', prompt: prompt.text, temperature: 0, max_tokens: maxTokens, stream: true,
      })) {
        for (const choice of event.choices) text += choice.text;
      }
      assert.equal(text, prompt.generated_text, `stream ${i}`);
    }
  });
  await Promise.all(runs);
});

// A long generation (ignore_eos: vLLM's extension) on solo's only generation slot.
const endless = () => solo.chat.completions.create({
  model: 'tiny', messages: [{ role: 'user', content: 'Tell me a fortune.' }], temperature: 0,
  max_tokens: 400, ignore_eos: true, stream: true,
});

// Reads `count` content events of a stream, then drops the connection.
async function readThenDrop(stream, count) {
  let seen = 0;
  for await (const event of stream) {
    if (event.choices[0]?.delta?.content && ++seen >= count) break;  // break aborts the request
  }
  return seen;
}

// Retries a short generation on solo while cloisterd answers 429 (the slot is still held).
async function whenSoloIsFree(limitMs) {
  const started = Date.now();
  for (;;) {
    try {
      return await solo.chat.completions.create({
        model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 1, temperature: 0,
      });
    } catch (e) {
      if (!(e instanceof OpenAI.RateLimitError) || Date.now() - started > limitMs) throw e;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

check('overload is 429 with Retry-After, a request that can never fit 400', async () => {
  // metered may generate 60 tokens (prompt and max_tokens) and gets 0.5 more a second.
  const ask = (maxTokens) => metered.chat.completions.create({
    model: 'tiny', messages: [{ role: 'user', content: 'Hi' }], max_tokens: maxTokens,
    ignore_eos: true, temperature: 0,
  });
  await expectError(ask(100), { status: 400, code: 'request_too_large' });
  const first = await ask(30);
  assert.equal(first.usage.completion_tokens, 30);
  const refused = await expectError(ask(30), { status: 429, code: 'rate_limit_exceeded' });
  assert.equal(refused.headers.get('retry-after'), '1');
});

check('a client that disconnects mid-stream cancels its generation and frees the slot',
  async () => {
    const seen = await readThenDrop(await endless(), 3);
    assert.equal(seen, 3);
    // The slot is free again (the driver checks the enclave's receipt: the stream stopped
    // short of its 400 tokens).
    const after = await whenSoloIsFree(20_000);
    assert.equal(after.choices.length, 1);
  });

check('prompts with the canary string go through', async () => {
  const messages = [{ role: 'user', content: `Remember the word ${canary}, please.` }];
  const plain = await acme.chat.completions.create({ model: 'tiny', messages, max_tokens: 8,
    temperature: 0 });
  assert.equal(plain.choices.length, 1);
  const read = await readChatStream(await acme.chat.completions.create({
    model: 'tiny', messages, max_tokens: 8, temperature: 0, stream: true }));
  assert.equal(read.text, plain.choices[0].message.content);
  await acme.completions.create({ model: 'tiny', prompt: `${canary} ${canary}`, max_tokens: 4 });
});

let failed = 0;
for (const { name, body } of checks) {
  try {
    await body();
    console.log(`ok ${name}`);
  } catch (e) {
    failed += 1;
    console.log(`FAIL ${name}: ${e?.stack ?? e}`);
  }
}
console.log(failed === 0 ? 'all checks passed' : `${failed} of ${checks.length} checks failed`);
process.exit(failed === 0 ? 0 : 1);
