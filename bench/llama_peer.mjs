// The llama.cpp side of `cloister-bench llm-vs-llamacpp`: loads one GGUF model into llama.cpp
// through node-llama-cpp (its prebuilt CPU build; nothing is downloaded or compiled), greedy-decodes
// the given prompt token ids in 1 or N concurrent sequences of one context (so llama.cpp batches
// them in each llama_decode call), and prints one JSON document with the generated ids of every
// sequence and the prefill and decode timings.
//
//   node llama_peer.mjs --modules NODE_MODULES_DIR --model FILE.gguf --prompts FILE.json
//        [--threads 1] [--sequences 1,16] [--decode-tokens 64] [--warmup 1] [--repeats 3]
//        [--step-tokens 512] [--flash-attention off|on|auto] [--kv-type F32|F16|BF16]
//
// FILE.json is a JSON array of prompts, each an array of token ids; sequence i of a run uses
// prompt i modulo their count. --step-tokens is llama.cpp's batch size: the most tokens one
// llama_decode call carries (prompt chunks of all sequences together).
//
// Each run (one per --sequences value) gets a context of its own with that many sequences, a
// context size per sequence of the longest prompt plus --decode-tokens, the KV cache type and
// the flash-attention setting asked for, and exactly --threads threads (llama.cpp's n_threads and
// n_threads_batch). A run is --warmup untimed passes and --repeats timed ones; each pass:
//   1. clears every sequence's history;
//   2. prefill: starts all N sequences' evaluate() at once and waits until each has yielded its
//      first token (the prompt evaluated, one greedy token sampled). The generators stay
//      suspended there, so no decode work overlaps this phase;
//   3. decode: resumes all N and takes --decode-tokens - 1 more tokens from each, concurrently.
// prefill_tokens_per_s = (sum of prompt lengths) / prefill time; decode_tokens_per_s =
// N * (decode_tokens - 1) / decode time. Medians over the repeats, every repeat listed too.
// Greedy means temperature 0; end-of-generation tokens are yielded and decoding goes on past them
// (a fixed amount of work). generated_ids are those of the first timed pass (decode_tokens per
// sequence, the first one sampled after the prefill); ids_stable says whether every pass
// (warm-up included) produced the same ids. Each repeat also counts its llama_decode calls per
// phase, which shows that the N sequences were batched. peak_rss_bytes is the process's peak resident set
// over the run (reset before it through /proc/self/clear_refs), model pages included.
//
// Exit status: 0 with the document on stdout; 2 when node-llama-cpp or its prebuilt binary does
// not load (one line on stderr); 1 for bad arguments or a failure while running (one line on
// stderr).
import fs from 'node:fs';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';

const kUsage = 'usage: node llama_peer.mjs --modules NODE_MODULES_DIR --model FILE.gguf ' +
  '--prompts FILE.json [--threads N] [--sequences 1,16] [--decode-tokens N] [--warmup N] ' +
  '[--repeats N] [--step-tokens N] [--flash-attention off|on|auto] [--kv-type F32|F16|BF16]';

function fail(message, status = 1) {
  process.stderr.write(`llama_peer: ${message}\n`);
  process.exit(status);
}

function parseArgs(argv) {
  const options = {
    modules: null, model: null, prompts: null, threads: 1, sequences: [1], decodeTokens: 64,
    warmup: 1, repeats: 3, stepTokens: 512, flashAttention: 'off', kvType: 'F32',
  };
  const integer = (flag, text, minimum) => {
    if (!/^[0-9]+$/.test(text) || Number(text) < minimum) {
      fail(`${flag} wants an integer of at least ${minimum}, not "${text}"`);
    }
    return Number(text);
  };
  for (let i = 0; i < argv.length; i++) {
    let flag = argv[i];
    let value;
    const equals = flag.indexOf('=');
    if (flag.startsWith('--') && equals > 0) {
      value = flag.slice(equals + 1);
      flag = flag.slice(0, equals);
    }
    if (flag === '--help' || flag === '-h') {
      process.stdout.write(kUsage + '\n');
      process.exit(0);
    }
    if (value === undefined) {
      if (i + 1 >= argv.length) fail(`${flag} wants a value (${kUsage})`);
      value = argv[++i];
    }
    switch (flag) {
      case '--modules': options.modules = value; break;
      case '--model': options.model = value; break;
      case '--prompts': options.prompts = value; break;
      case '--threads': options.threads = integer(flag, value, 1); break;
      case '--sequences':
        options.sequences = value.split(',').map((part) => integer(flag, part, 1));
        break;
      case '--decode-tokens': options.decodeTokens = integer(flag, value, 1); break;
      case '--warmup': options.warmup = integer(flag, value, 0); break;
      case '--repeats': options.repeats = integer(flag, value, 1); break;
      case '--step-tokens': options.stepTokens = integer(flag, value, 1); break;
      case '--flash-attention':
        if (!['off', 'on', 'auto'].includes(value)) fail(`--flash-attention wants off, on or auto, not "${value}"`);
        options.flashAttention = value;
        break;
      case '--kv-type':
        if (!['F32', 'F16', 'BF16'].includes(value)) fail(`--kv-type wants F32, F16 or BF16, not "${value}"`);
        options.kvType = value;
        break;
      default: fail(`unknown flag ${flag} (${kUsage})`);
    }
  }
  for (const [flag, key] of [['--modules', 'modules'], ['--model', 'model'], ['--prompts', 'prompts']]) {
    if (!options[key]) fail(`${flag} is required (${kUsage})`);
  }
  return options;
}

function readPrompts(file) {
  let prompts;
  try {
    prompts = JSON.parse(fs.readFileSync(file, 'utf8'));
  } catch (error) {
    fail(`cannot read the prompts in ${file}: ${String(error.message).split('\n')[0]}`);
  }
  const isTokenList = (list) => Array.isArray(list) && list.length > 0 &&
    list.every((id) => Number.isInteger(id) && id >= 0);
  if (!Array.isArray(prompts) || prompts.length === 0 || !prompts.every(isTokenList)) {
    fail(`${file} must hold a non-empty JSON array of non-empty arrays of token ids`);
  }
  return prompts;
}

// Loads node-llama-cpp from `modulesDir` (the node_modules folder, or the npm folder above it).
async function importNodeLlamaCpp(modulesDir) {
  const candidates = [path.resolve(modulesDir), path.resolve(modulesDir, 'node_modules')];
  for (const dir of candidates) {
    const packageDir = path.join(dir, 'node-llama-cpp');
    const manifest = path.join(packageDir, 'package.json');
    if (!fs.existsSync(manifest)) continue;
    const version = JSON.parse(fs.readFileSync(manifest, 'utf8')).version;
    const module = await import(pathToFileURL(path.join(packageDir, 'dist', 'index.js')).href);
    return { module, version };
  }
  fail(`node-llama-cpp not found in ${modulesDir} (install it with scripts/install-bench-deps.sh)`, 2);
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
}

// Resets the kernel's peak-RSS mark of this process (Linux: "5" to clear_refs); false when the
// kernel refuses, in which case the reported peak is that of the whole process lifetime.
function resetPeakRss() {
  try {
    fs.writeFileSync('/proc/self/clear_refs', '5');
    return true;
  } catch {
    return false;
  }
}

function peakRssBytes() {
  const match = fs.readFileSync('/proc/self/status', 'utf8').match(/^VmHWM:\s+(\d+) kB/m);
  return match ? Number(match[1]) * 1024 : null;
}

// Counts llama_decode calls by wrapping the context's native decodeBatch (an internal of
// node-llama-cpp; when it is not there the counts are null). The count shows whether the N
// sequences' tokens really went through llama.cpp together: N concurrent sequences decoding
// D - 1 tokens each should take D - 1 calls, not N * (D - 1).
function countDecodeCalls(context) {
  const native = context._ctx;
  if (!native || typeof native.decodeBatch !== 'function') return () => null;
  let calls = 0;
  // The native object's methods are read-only, so the context gets a proxy in front of it.
  const proxy = new Proxy(native, {
    get(target, key) {
      const value = target[key];
      if (typeof value !== 'function') return value;
      if (key === 'decodeBatch') {
        return (...args) => {
          calls++;
          return value.apply(target, args);
        };
      }
      return value.bind(target);
    },
  });
  try {
    context._ctx = proxy;
  } catch {
    return () => null;
  }
  return () => calls;
}

// node-llama-cpp's default schedule sends whatever is queued on the next event-loop turn; after a
// batch, each sequence samples its token asynchronously and queues its next one, so that turn
// often comes before all of them have queued, and llama.cpp would run one step of N sequences as
// two or three calls. Both sides of the benchmark should run one step for all N sequences, as
// our Generator does, so this schedule waits (turn by turn, at most kMaxQueueWaitMs) until all
// `count` sequences have queued. It reads the context's set of queued sequences (an internal of
// node-llama-cpp); without it, it falls back to the next turn.
const kMaxQueueWaitMs = 5;
function dispatchWhenAllQueued(getContext, count, dispatch) {
  const started = performance.now();
  const check = () => {
    const queued = getContext()?._queuedDecodeSequenceIds?.size;
    if (queued === undefined || queued >= count || performance.now() - started > kMaxQueueWaitMs) {
      dispatch();
    } else {
      setImmediate(check);
    }
  };
  setImmediate(check);
}

// One pass over `sequences` (already cleared): prefill all, then decode all; times in seconds.
async function pass(sequences, prompts, decodeTokens, decodeCalls) {
  const evaluateOptions = { temperature: 0, yieldEogToken: true };
  const generated = sequences.map(() => []);
  const start = performance.now();
  const iterators = sequences.map((sequence, i) =>
    sequence.evaluate(prompts[i], evaluateOptions)[Symbol.asyncIterator]());
  const callsBefore = decodeCalls();
  const firsts = await Promise.all(iterators.map((iterator) => iterator.next()));
  const prefillEnd = performance.now();
  const callsAfterPrefill = decodeCalls();
  firsts.forEach((step, i) => {
    if (step.done) throw new Error(`sequence ${i} produced no token after its prompt`);
    generated[i].push(step.value);
  });
  // In lock step: every sequence's next token is asked for in the same turn, after all of the
  // previous step's tokens are in.
  for (let produced = 1; produced < decodeTokens; produced++) {
    const steps = await Promise.all(iterators.map((iterator) => iterator.next()));
    steps.forEach((step, i) => {
      if (step.done) throw new Error(`sequence ${i} stopped after ${generated[i].length} tokens`);
      generated[i].push(step.value);
    });
  }
  const decodeEnd = performance.now();
  const callsAfterDecode = decodeCalls();
  await Promise.all(iterators.map((iterator) => iterator.return()));
  const counted = callsBefore !== null;
  return {
    generated,
    prefillSeconds: (prefillEnd - start) / 1e3,
    decodeSeconds: (decodeEnd - prefillEnd) / 1e3,
    prefillCalls: counted ? callsAfterPrefill - callsBefore : null,
    decodeCalls: counted ? callsAfterDecode - callsAfterPrefill : null,
  };
}

async function run(model, options, allPrompts, count) {
  const prompts = Array.from({ length: count }, (_, i) => allPrompts[i % allPrompts.length]);
  const longest = Math.max(...prompts.map((prompt) => prompt.length));
  const flashAttention = options.flashAttention === 'auto' ? 'auto' : options.flashAttention === 'on';
  const peakReset = resetPeakRss();
  let context = null;
  const created = await model.createContext({
    sequences: count,
    contextSize: longest + options.decodeTokens,
    batchSize: options.stepTokens,
    threads: { ideal: options.threads, min: options.threads },
    flashAttention,
    experimentalKvCacheKeyType: options.kvType,
    experimentalKvCacheValueType: options.kvType,
    batching: { dispatchSchedule: (dispatch) => dispatchWhenAllQueued(() => context, count, dispatch) },
  });
  context = created;
  try {
    const sequences = Array.from({ length: count }, () => context.getSequence());
    const decodeCalls = countDecodeCalls(context);
    const timed = [];
    let firstIds = null;
    let stable = true;
    for (let p = 0; p < options.warmup + options.repeats; p++) {
      for (const sequence of sequences) await sequence.clearHistory();
      const result = await pass(sequences, prompts, options.decodeTokens, decodeCalls);
      const ids = JSON.stringify(result.generated);
      if (firstIds === null) firstIds = ids;
      else if (ids !== firstIds) stable = false;
      if (p >= options.warmup) timed.push(result);
    }
    const prefillTokens = prompts.reduce((sum, prompt) => sum + prompt.length, 0);
    const decodeTokens = count * (options.decodeTokens - 1);
    const prefillRates = timed.map((t) => prefillTokens / t.prefillSeconds);
    const decodeRates = timed.map((t) => (decodeTokens > 0 ? decodeTokens / t.decodeSeconds : 0));
    return {
      sequences: count,
      context_size_per_sequence: longest + options.decodeTokens,
      prompt_tokens: prompts.map((prompt) => prompt.length),
      prefill_tokens: prefillTokens,
      decode_tokens: decodeTokens,
      prefill_s: median(timed.map((t) => t.prefillSeconds)),
      decode_s: median(timed.map((t) => t.decodeSeconds)),
      prefill_tokens_per_s: median(prefillRates),
      decode_tokens_per_s: median(decodeRates),
      repeats: timed.map((t, i) => ({
        prefill_s: t.prefillSeconds, decode_s: t.decodeSeconds,
        prefill_tokens_per_s: prefillRates[i], decode_tokens_per_s: decodeRates[i],
        prefill_llama_decode_calls: t.prefillCalls, decode_llama_decode_calls: t.decodeCalls,
      })),
      ids_stable: stable,
      generated_ids: timed[0].generated,
      peak_rss_bytes: peakRssBytes(),
      peak_rss_scope: peakReset ? 'run' : 'process',
    };
  } finally {
    await context.dispose();
  }
}

// Key and value bytes per token over all layers, from the GGUF metadata and the cache type.
function kvBytesPerToken(info, kvType) {
  const arch = info.metadata?.general?.architecture;
  const meta = info.metadata?.[arch] ?? {};
  const layers = Number(meta.block_count);
  const heads = Number(meta.attention?.head_count);
  const kvHeads = Number(meta.attention?.head_count_kv ?? heads);
  const embedding = Number(meta.embedding_length);
  const keyLength = Number(meta.attention?.key_length ?? embedding / heads);
  const valueLength = Number(meta.attention?.value_length ?? embedding / heads);
  const elementSize = kvType === 'F32' ? 4 : 2;
  const bytes = layers * kvHeads * (keyLength + valueLength) * elementSize;
  return Number.isFinite(bytes) ? bytes : null;
}

const options = parseArgs(process.argv.slice(2));
const prompts = readPrompts(options.prompts);
if (!fs.existsSync(options.model)) fail(`model ${options.model} not found`);
const { module: nlc, version } = await importNodeLlamaCpp(options.modules);

let llama;
try {
  llama = await nlc.getLlama({
    gpu: false, build: 'never', usePrebuiltBinaries: true, skipDownload: true,
    maxThreads: options.threads, logLevel: nlc.LlamaLogLevel.error, progressLogs: false,
  });
} catch (error) {
  fail(`node-llama-cpp ${version} could not load its prebuilt CPU binary: ${String(error.message ?? error).split('\n')[0]}`, 2);
}

try {
  const info = await nlc.readGgufFileInfo(options.model, { logWarnings: false });
  const loadStart = performance.now();
  const model = await llama.loadModel({ modelPath: options.model, gpuLayers: 0 });
  const loadSeconds = (performance.now() - loadStart) / 1e3;
  const runs = [];
  for (const count of options.sequences) runs.push(await run(model, options, prompts, count));
  const document = {
    peer: 'node-llama-cpp',
    version,
    llama_cpp_build: llama.buildType,
    llama_cpp_release: llama.llamaCppRelease?.release ?? null,
    system_info: llama.systemInfo,
    node: process.version,
    model: options.model,
    model_file_bytes: fs.statSync(options.model).size,
    load_s: loadSeconds,
    threads: options.threads,
    step_tokens: options.stepTokens,
    flash_attention: options.flashAttention,
    kv_type: options.kvType,
    kv_bytes_per_token: kvBytesPerToken(info, options.kvType),
    warmup: options.warmup,
    repeat_count: options.repeats,
    decode_tokens_per_sequence: options.decodeTokens,
    runs,
  };
  await model.dispose();
  await llama.dispose();
  process.stdout.write(JSON.stringify(document) + '\n');
} catch (error) {
  fail(String(error.message ?? error).split('\n')[0]);
}
