// Golden chat-template renderings from the independent reference implementation,
// @huggingface/jinja 0.5.11 (the Jinja engine transformers.js uses for apply_chat_template).
//
// Reads DIR/templates.json ([{name, file, bos_token, eos_token}]) and DIR/conversations.json
// ([{name, messages, add_generation_prompt, tools?, extra?}]), renders every template with
// every conversation the way transformers.js does (new Template(source), which turns on
// trim_blocks and lstrip_blocks, then render({messages, add_generation_prompt, tools,
// bos_token, eos_token, ...extra})) and writes DIR/goldens.json: one entry per pair with the
// rendered "text", or the "error" message the reference raised. strftime_now sees a fixed clock
// (1800000000 s after the epoch, UTC), the same instant as the C++ FakeClock's default, so that
// enclave/llm/chat_template_test.cc can compare byte for byte. Install the package with
// scripts/install-reference-deps.sh, then:
//   node tests/conformance/llm/chat_template_reference.mjs enclave/llm/testdata/chat_templates
// CLOISTER_JINJA_MODULE may name another copy of the package's dist/index.js to import.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

process.env.TZ = 'UTC';
const FIXED_NOW_MS = 1800000000 * 1000;
const RealDate = Date;
// Only `new Date()` without arguments (what strftime_now calls) is pinned.
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) {
      super(FIXED_NOW_MS);
    } else {
      super(...args);
    }
  }
  static now() {
    return FIXED_NOW_MS;
  }
};

const moduleName = process.env.CLOISTER_JINJA_MODULE
  ? pathToFileURL(process.env.CLOISTER_JINJA_MODULE).href
  : '@huggingface/jinja';
const { Template } = await import(moduleName);

const dir = process.argv[2];
if (!dir) {
  console.error('usage: node chat_template_reference.mjs TESTDATA_DIR');
  process.exit(2);
}
const templates = JSON.parse(fs.readFileSync(path.join(dir, 'templates.json'), 'utf8'));
const conversations = JSON.parse(fs.readFileSync(path.join(dir, 'conversations.json'), 'utf8'));

const goldens = [];
for (const entry of templates) {
  const source = fs.readFileSync(path.join(dir, entry.file), 'utf8');
  const template = new Template(source);
  for (const conversation of conversations) {
    const context = {
      messages: conversation.messages,
      add_generation_prompt: conversation.add_generation_prompt,
      bos_token: entry.bos_token,
      eos_token: entry.eos_token,
    };
    if (conversation.tools !== undefined) context.tools = conversation.tools;
    Object.assign(context, conversation.extra ?? {});
    const golden = { template: entry.name, conversation: conversation.name };
    try {
      golden.text = template.render(context);
    } catch (error) {
      golden.error = String(error.message);
    }
    goldens.push(golden);
  }
}
fs.writeFileSync(path.join(dir, 'goldens.json'), JSON.stringify(goldens, null, 1) + '\n');
const failures = goldens.filter((g) => g.error !== undefined).length;
console.log(`wrote ${goldens.length} goldens (${failures} expected errors) to ${path.join(dir, 'goldens.json')}`);
