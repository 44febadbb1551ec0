// The ONNX Runtime side of `cloister-bench runtime-vs-ort`: a long-lived child process that
// loads one model at a time into onnxruntime-node and times session.run() on request, so that
// cloister-bench can interleave blocks of our runs with blocks of ORT runs on the same inputs.
//
//   node ort_peer.js NODE_MODULES_DIR
//
// Protocol: one JSON object per line on stdin, one JSON reply per line on stdout. The first
// line written is the greeting {"ok":true,"ort_version":"..."} (or {"ok":false,"error":"..."}
// and exit 3 when onnxruntime-node cannot be loaded from NODE_MODULES_DIR). Requests:
//   {"op":"load","model":PATH,"threads":N,"inputs":[{"name","dtype","dims","file"}]}
//       creates a session (optimisation level all, N intra-op threads, one inter-op thread,
//       sequential execution) and reads each input from FILE (raw little-endian elements;
//       dtype float32 or int64). Reply: {"ok":true,"load_ms":X,"outputs":[names]}.
//   {"op":"time","iterations":K}  runs K times; reply {"ok":true,"times_ms":[...]}.
//   {"op":"dump","dir":DIR}  runs once and writes output K to DIR/ort_output_K.bin; reply
//       {"ok":true,"outputs":[{"name","dtype","dims","file"}]}.
//   {"op":"quit"}  exits.
// A failed request answers {"ok":false,"error":"..."} and the process keeps serving.
'use strict';

const fs = require('fs');
const path = require('path');
const readline = require('readline');

function reply(object) {
  process.stdout.write(JSON.stringify(object) + '\n');
}

const modulesDir = process.argv[2];
if (!modulesDir) {
  reply({ok: false, error: 'usage: node ort_peer.js NODE_MODULES_DIR'});
  process.exit(3);
}

let ort;
let ortVersion;
try {
  const packageDir = path.join(path.resolve(modulesDir), 'onnxruntime-node');
  ort = require(packageDir);
  ortVersion = require(path.join(packageDir, 'package.json')).version;
} catch (error) {
  const firstLine = String(error.message).split('\n')[0];
  reply({ok: false, error: `cannot load onnxruntime-node from ${modulesDir}: ${firstLine}`});
  process.exit(3);
}

// Typed-array constructors for the element types the benchmark feeds and reads back.
const kArrayTypes = {
  float32: Float32Array,
  int64: BigInt64Array,
  int32: Int32Array,
  uint8: Uint8Array,
  bool: Uint8Array,
  float64: Float64Array,
};

function readInput(spec) {
  const ArrayType = kArrayTypes[spec.dtype];
  if (!ArrayType) throw new Error(`input ${spec.name}: unsupported dtype ${spec.dtype}`);
  const bytes = fs.readFileSync(spec.file);
  const count = spec.dims.reduce((a, b) => a * b, 1);
  if (bytes.length !== count * ArrayType.BYTES_PER_ELEMENT) {
    throw new Error(`input ${spec.name}: ${spec.file} holds ${bytes.length} bytes, ` +
                    `dims [${spec.dims}] need ${count * ArrayType.BYTES_PER_ELEMENT}`);
  }
  // Copy into a fresh ArrayBuffer: a Node Buffer may sit at an unaligned offset of a pool.
  const data = new ArrayType(count);
  new Uint8Array(data.buffer).set(bytes);
  return new ort.Tensor(spec.dtype, data, spec.dims);
}

let session = null;
let feeds = null;

async function handle(request) {
  switch (request.op) {
    case 'load': {
      session = null;
      feeds = {};
      for (const spec of request.inputs) feeds[spec.name] = readInput(spec);
      const started = process.hrtime.bigint();
      session = await ort.InferenceSession.create(request.model, {
        graphOptimizationLevel: 'all',
        intraOpNumThreads: request.threads,
        interOpNumThreads: 1,
        executionMode: 'sequential',
        logSeverityLevel: 3,  // errors only: ORT warns about unused initializers on stderr
      });
      const loadMs = Number(process.hrtime.bigint() - started) / 1e6;
      return {ok: true, load_ms: loadMs, outputs: session.outputNames};
    }
    case 'time': {
      if (!session) throw new Error('time before load');
      const times = [];
      for (let i = 0; i < request.iterations; ++i) {
        const started = process.hrtime.bigint();
        await session.run(feeds);
        times.push(Number(process.hrtime.bigint() - started) / 1e6);
      }
      return {ok: true, times_ms: times};
    }
    case 'dump': {
      if (!session) throw new Error('dump before load');
      const results = await session.run(feeds);
      const outputs = [];
      session.outputNames.forEach((name, index) => {
        const tensor = results[name];
        const file = path.join(request.dir, `ort_output_${index}.bin`);
        const data = tensor.data;
        fs.writeFileSync(file, new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
        outputs.push({name, dtype: tensor.type, dims: tensor.dims, file});
      });
      return {ok: true, outputs};
    }
    case 'quit':
      process.exit(0);
    default:
      throw new Error(`unknown op ${JSON.stringify(request.op)}`);
  }
}

// Requests are handled strictly one after another, in arrival order.
let queue = Promise.resolve();
const lines = readline.createInterface({input: process.stdin});
lines.on('line', (line) => {
  queue = queue.then(async () => {
    try {
      reply(await handle(JSON.parse(line)));
    } catch (error) {
      reply({ok: false, error: String(error.message).split('\n')[0]});
    }
  });
});
lines.on('close', () => {
  queue.then(() => process.exit(0));
});

reply({ok: true, ort_version: ortVersion});
