// Golden tokenizer outputs from the independent reference implementation, transformers.js
// (@huggingface/transformers 4.3.1, AutoTokenizer from a local folder, no network).
//
// For each tokenizer folder (tokenizer.json + tokenizer_config.json) it encodes the corpus below
// with and without special tokens, decodes the ids with and without skip_special_tokens, decodes
// some awkward id lists (a prefix that cuts a character, the ids reversed), and writes
// OUT_DIR/<folder name>.golden.json. enclave/llm/tokenizer_test.cc checks our tokenizer against
// these files exactly. Install the pinned package with scripts/install-reference-deps.sh, then:
//   node tests/conformance/llm/tokenizer_reference.mjs enclave/llm/testdata/tokenizers \
//       enclave/llm/testdata/tokenizers/* MODELS/llm/tiny-llama
import fs from 'node:fs';
import path from 'node:path';
import { AutoTokenizer, env } from '@huggingface/transformers';

env.allowRemoteModels = false;  // never touch the network
env.allowLocalModels = true;
env.useFSCache = false;

// Strings that exercise every stage: contractions, whitespace runs, tabs and newlines, digit
// runs, non-ASCII scripts, emoji (ZWJ sequences, skin tones), combining characters (NFC),
// special-token text inside strings, and the empty string.
const CORPUS = [
  '',
  'Hello world',
  'hello',
  ' Hello world',
  'Hello, world! How\'s it going? I\'m fine, you\'re great, we\'ve won, they\'ll see, he\'d go.',
  'I DON\'T KNOW, She\'S HERE',
  'don\'t stop , said he . really ? yes ! it \' s',
  '  leading spaces and trailing   ',
  'tabs\tand\nnewlines\r\n\n\nblank lines\n',
  'indented\n    code\n\tblock',
  ' ',
  '   ',
  '\n',
  '\n\n \n',
  'a',
  'digits 1234567890 and 3.14159 and 42, 007, 1,000,000',
  'Numbers ١٢٣ ٤٥٦ and ½ ² ³',
  'café naïve résumé Ångström',
  'cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030angstro\u0308m',
  'Ünïcödé ÀÉÎÕÜ ß ﬁ ligature ẞ',
  '日本語のテキストと中文字符，还有한국어도 있습니다。',
  'emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 heart ❤️',
  'mixed العربية русский ελληνικά עברית हिन्दी',
  'nbsp\u00a0and\u3000ideographic\u2003em space',
  'x=1;y=2 // code: if (a<b) { return a+b; } else { return [a, b]; }',
  'UPPER lower MiXeD CamelCase snake_case kebab-case',
  'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
  'the tokenizer said hello world to the fortune teller',
  'hello world tokenizer fortune 1234',
  '<|endoftext|>',
  'before<|endoftext|>after',
  'text <|endoftext|> more <|endoftext|><|endoftext|>end',
  '<s>Hello</s>',
  '<s> Hello </s> and <unk> here',
  'Hello <mask> world <mask>',
  '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>',
  '<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n',
  'call <tool_call>{"name": "f"}</tool_call> now',
  'the cafe\u0301 and the café',
  '<|eot_id|><|eot_id|>',
  '<|begin_of_text',
  'The quick brown fox jumps over the lazy dog. '.repeat(8),
];

function same(a, b) { return JSON.stringify(a) === JSON.stringify(b); }

function decode(tok, ids, skip) {
  return ids.length === 0 ? '' : tok.decode(ids, { skip_special_tokens: skip });  // decode([]) throws
}

const [outDir, ...folders] = process.argv.slice(2);
if (!outDir || folders.length === 0) {
  console.error('usage: node tokenizer_reference.mjs OUT_DIR TOKENIZER_FOLDER...');
  process.exit(2);
}
for (const folder of folders) {
  const dir = path.resolve(folder);
  if (!fs.existsSync(path.join(dir, 'tokenizer.json'))) continue;
  env.localModelPath = path.dirname(dir) + path.sep;
  const name = path.basename(dir);
  const tok = await AutoTokenizer.from_pretrained(name, { local_files_only: true });
  const cases = [];
  const decodeCases = [];
  for (const text of CORPUS) {
    const withSpecial = Array.from(tok.encode(text, { add_special_tokens: true }));
    const withoutSpecial = Array.from(tok.encode(text, { add_special_tokens: false }));
    cases.push({
      text,
      ids_with_special_tokens: withSpecial,
      ids_without_special_tokens: withoutSpecial,
      decoded: decode(tok, withSpecial, false),
      decoded_skip_special_tokens: decode(tok, withSpecial, true),
    });
    if (withoutSpecial.length > 1) {
      for (const ids of [withoutSpecial.slice(0, -1), withoutSpecial.slice().reverse()]) {
        if (decodeCases.some((c) => same(c.ids, ids))) continue;
        decodeCases.push({ ids, decoded: decode(tok, ids, false), decoded_skip_special_tokens: decode(tok, ids, true) });
      }
    }
  }
  const golden = {
    generator: 'tests/conformance/llm/tokenizer_reference.mjs',
    reference: `@huggingface/transformers ${env.version} (transformers.js, AutoTokenizer, local files only)`,
    tokenizer: name,
    bos_token: tok.bos_token, eos_token: tok.eos_token,
    bos_id: tok.bos_token_id ?? null, eos_id: tok.eos_token_id ?? null,
    cases,
    decode_cases: decodeCases,
  };
  const out = path.join(outDir, `${name}.golden.json`);
  fs.writeFileSync(out, JSON.stringify(golden, null, 1) + '\n');
  console.log(`${out}: ${cases.length} strings, ${decodeCases.length} decode cases`);
}
