#!/usr/bin/python3
"""Models for `cloister-bench llm-vs-llamacpp`, written into a cache folder on first use.

  /usr/bin/python3 make_synthetic_llama.py OUTDIR --tiny-dir TINY_LLAMA_DIR [--seed N]
      [--models tiny-bf16,synthetic,synthetic-1b]   (default: tiny-bf16,synthetic)

TINY_LLAMA_DIR is the shared tiny-llama checkpoint (config.json, tokenizer files,
model.safetensors in BF16, model.gguf in F32). Writes:

  OUTDIR/synthetic-110m/  a LlamaForCausalLM with random weights (hidden 1024, 9 layers, 16 heads,
      4 KV heads of 64, intermediate 2816, vocab 2048: 105.6 M parameters) drawn from a fixed seed
      (normal, std 0.02; RMSNorm weights 1), BF16-rounded once. As a Hugging Face folder
      (config.json, generation_config.json, tokenizer.json, tokenizer_config.json copied from the
      tiny model so the vocabulary is the same, model.safetensors in BF16) and as GGUF for
      llama.cpp: model-f32.gguf and model-bf16.gguf, holding exactly the same (BF16-rounded)
      values (in the BF16 file the RMSNorm weights stay F32, as llama.cpp's converter keeps
      1-D tensors).
  OUTDIR/synthetic-1b/  (only when asked for, for `cloister-bench llm-cuda`) the same kind of
      model at about 1 B parameters (hidden 2048, 16 layers, 32 heads, 8 KV heads of 64,
      intermediate 8192, vocab 2048: the shape of Llama 3.2 1B but the tiny vocabulary), as a
      Hugging Face folder only (no GGUF).
  OUTDIR/tiny-llama/model-bf16.gguf  the tiny model's weights (exactly its model.safetensors
      values) as a BF16 GGUF, beside its shipped F32 model.gguf.

The GGUF files (version 3, written here) use llama.cpp's tensor names and the metadata its
`llama` architecture reads; q and k rows are permuted from Hugging Face's rotate-half layout to
llama.cpp's interleaved-pair layout, as llama.cpp's converter does for llama. The tokenizer
metadata (tokenizer.*) is copied entry by entry from the tiny model's model.gguf.

Each folder gets a STAMP file (what was asked for, a digest of this script and of the tiny
model's inputs); a folder whose stamp matches is left alone, so a second run does nothing.
Needs only Debian's python3-torch and python3-numpy; synthetic-1b needs only numpy where torch
is missing (its weights are then drawn by numpy's PCG64 from the same seed, and the stamp says
which generator drew them).
"""
import argparse
import hashlib
import json
import os
import shutil
import struct
import sys

import numpy as np

try:
    import torch
except ImportError:  # a GPU machine may have numpy only: synthetic-1b is then drawn by numpy
    torch = None

SYNTHETIC = {
    'hidden_size': 1024,
    'num_hidden_layers': 9,
    'num_attention_heads': 16,
    'num_key_value_heads': 4,
    'head_dim': 64,
    'intermediate_size': 2816,
    'max_position_embeddings': 2048,
    'rms_norm_eps': 1e-5,
    'rope_theta': 10000.0,
}
SYNTHETIC_1B = dict(SYNTHETIC, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=8, intermediate_size=8192, rope_theta=500000.0)
WEIGHT_STD = 0.02
TOKENIZER_FILES = ['tokenizer.json', 'tokenizer_config.json', 'generation_config.json']

# GGUF value types and ggml tensor types (ggml's docs/gguf.md).
GGUF_UINT32, GGUF_FLOAT32, GGUF_BOOL, GGUF_STRING, GGUF_ARRAY = 4, 6, 7, 8, 9
GGUF_FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
GGML_F32, GGML_BF16 = 0, 30
LLAMA_FTYPE_ALL_F32, LLAMA_FTYPE_MOSTLY_BF16 = 0, 32
GGUF_ALIGNMENT = 32


def fail(message):
    sys.exit(f'make_synthetic_llama: {message}')


# ---------------------------------------------------------------------------------------------
# GGUF reading (only the key/value section, kept as raw bytes so entries can be copied verbatim)

class _Reader:
    def __init__(self, data):
        self.data, self.at = data, 0

    def take(self, size):
        if self.at + size > len(self.data):
            raise ValueError('truncated GGUF header')
        chunk = self.data[self.at:self.at + size]
        self.at += size
        return chunk

    def u32(self):
        return struct.unpack('<I', self.take(4))[0]

    def u64(self):
        return struct.unpack('<Q', self.take(8))[0]

    def string(self):
        return self.take(self.u64()).decode('utf-8')

    def skip_value(self, value_type):
        if value_type == GGUF_STRING:
            self.take(self.u64())
        elif value_type == GGUF_ARRAY:
            element_type, count = self.u32(), self.u64()
            if element_type in GGUF_FIXED_SIZES:
                self.take(GGUF_FIXED_SIZES[element_type] * count)
            else:
                for _ in range(count):
                    self.skip_value(element_type)
        elif value_type in GGUF_FIXED_SIZES:
            self.take(GGUF_FIXED_SIZES[value_type])
        else:
            raise ValueError(f'unknown GGUF value type {value_type}')


def read_gguf_entries(path):
    """The key/value entries of a GGUF file: {key: raw bytes of type + value}, in file order."""
    with open(path, 'rb') as f:
        head = f.read(24)
        if len(head) < 24 or head[:4] != b'GGUF':
            fail(f'{path} is not a GGUF file')
        version, _, kv_count = struct.unpack('<IQQ', head[4:])
        if version != 3:
            fail(f'{path}: GGUF version {version}, expected 3')
        # Tokenizer arrays of a 2048-token vocabulary take well under 16 MiB.
        reader = _Reader(f.read(1 << 24))
    entries = {}
    try:
        for _ in range(kv_count):
            key = reader.string()
            start = reader.at
            reader.skip_value(reader.u32())
            entries[key] = reader.data[start:reader.at]
    except (ValueError, UnicodeDecodeError) as error:
        fail(f'{path}: {error}')
    return entries


# ---------------------------------------------------------------------------------------------
# GGUF writing

def _gguf_string(text):
    raw = text.encode('utf-8')
    return struct.pack('<Q', len(raw)) + raw


class GgufFile:
    """Collects metadata and tensors, then writes a GGUF v3 file in one pass."""

    def __init__(self):
        self.entries = []   # (key, raw type + value)
        self.tensors = []   # (name, dims innermost first, ggml type, bytes)

    def add_raw(self, key, raw):
        self.entries.append((key, raw))

    def add_u32(self, key, value):
        self.add_raw(key, struct.pack('<II', GGUF_UINT32, value))

    def add_f32(self, key, value):
        self.add_raw(key, struct.pack('<If', GGUF_FLOAT32, value))

    def add_string(self, key, value):
        self.add_raw(key, struct.pack('<I', GGUF_STRING) + _gguf_string(value))

    def add_tensor(self, name, shape, ggml_type, data):
        """`shape` in row-major (PyTorch) order; GGUF stores it innermost first."""
        self.tensors.append((name, list(reversed(shape)), ggml_type, data))

    def write(self, path):
        header = [b'GGUF', struct.pack('<IQQ', 3, len(self.tensors), len(self.entries))]
        for key, raw in self.entries:
            header += [_gguf_string(key), raw]
        offsets, offset = [], 0
        for _, _, _, data in self.tensors:
            offsets.append(offset)
            offset += len(data)
            offset += -offset % GGUF_ALIGNMENT
        for (name, dims, ggml_type, _), tensor_offset in zip(self.tensors, offsets):
            header.append(_gguf_string(name))
            header.append(struct.pack('<I', len(dims)) + struct.pack(f'<{len(dims)}Q', *dims))
            header.append(struct.pack('<IQ', ggml_type, tensor_offset))
        blob = b''.join(header)
        temporary = path + '.partial'
        with open(temporary, 'wb') as f:
            f.write(blob)
            f.write(b'\0' * (-len(blob) % GGUF_ALIGNMENT))
            for data in (t[3] for t in self.tensors):
                f.write(data)
                f.write(b'\0' * (-len(data) % GGUF_ALIGNMENT))
        os.replace(temporary, path)


# ---------------------------------------------------------------------------------------------
# safetensors (BF16 only: what the tiny model ships and what the synthetic one is written in)

def write_safetensors(path, tensors):
    """tensors: {name: (shape, BF16 bytes)}, written in name order."""
    header, offset = {}, 0
    for name in sorted(tensors):
        shape, data = tensors[name]
        header[name] = {'dtype': 'BF16', 'shape': list(shape), 'data_offsets': [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(',', ':')).encode('utf-8')
    raw += b' ' * (-len(raw) % 8)
    temporary = path + '.partial'
    with open(temporary, 'wb') as f:
        f.write(struct.pack('<Q', len(raw)))
        f.write(raw)
        for name in sorted(tensors):
            f.write(tensors[name][1])
    os.replace(temporary, path)


def read_safetensors_bf16(path):
    """{name: uint16 array of BF16 bits, shaped}; refuses any other dtype."""
    with open(path, 'rb') as f:
        data = f.read()
    header_size = struct.unpack('<Q', data[:8])[0]
    header = json.loads(data[8:8 + header_size])
    base = 8 + header_size
    out = {}
    for name, info in header.items():
        if name == '__metadata__':
            continue
        if info['dtype'] != 'BF16':
            fail(f'{path}: tensor {name} is {info["dtype"]}, expected BF16')
        begin, end = info['data_offsets']
        out[name] = np.frombuffer(data[base + begin:base + end], dtype='<u2').reshape(info['shape'])
    return out


# ---------------------------------------------------------------------------------------------
# The llama layout in GGUF

def rope_rows_to_llama_cpp(weight, heads):
    """Reorders the rows of a q or k projection (out_features first) from Hugging Face's layout,
    where rotate-half pairs row i with row i + head_dim/2 of each head, to llama.cpp's, which
    pairs rows 2i and 2i+1; llama.cpp's converter applies the same permutation for `llama`."""
    rows = weight.shape[0]
    half = rows // heads // 2
    return (weight.reshape(heads, 2, half, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def gguf_tensor_names(layers):
    """(GGUF name, Hugging Face name) in llama.cpp's usual order."""
    names = [('token_embd.weight', 'model.embed_tokens.weight')]
    parts = [('attn_norm', 'input_layernorm'), ('attn_q', 'self_attn.q_proj'),
             ('attn_k', 'self_attn.k_proj'), ('attn_v', 'self_attn.v_proj'),
             ('attn_output', 'self_attn.o_proj'), ('ffn_norm', 'post_attention_layernorm'),
             ('ffn_gate', 'mlp.gate_proj'), ('ffn_up', 'mlp.up_proj'), ('ffn_down', 'mlp.down_proj')]
    for layer in range(layers):
        names += [(f'blk.{layer}.{g}.weight', f'model.layers.{layer}.{h}.weight') for g, h in parts]
    names += [('output_norm.weight', 'model.norm.weight'), ('output.weight', 'lm_head.weight')]
    return names


def write_llama_gguf(path, config, name, bf16_weights, tokenizer_entries, as_bf16):
    """bf16_weights: {HF name: uint16 array of BF16 bits}. as_bf16: store the matrices in BF16
    (else F32, the same values widened)."""
    if config.get('tie_word_embeddings') or config.get('attention_bias') or config.get('rope_scaling'):
        fail('only untied, bias-free llama checkpoints without rope scaling are written')
    heads, kv_heads = config['num_attention_heads'], config['num_key_value_heads']
    head_dim = config.get('head_dim') or config['hidden_size'] // heads
    g = GgufFile()
    g.add_string('general.architecture', 'llama')
    g.add_string('general.name', name)
    g.add_u32('general.file_type', LLAMA_FTYPE_MOSTLY_BF16 if as_bf16 else LLAMA_FTYPE_ALL_F32)
    g.add_u32('llama.vocab_size', config['vocab_size'])
    g.add_u32('llama.context_length', config['max_position_embeddings'])
    g.add_u32('llama.embedding_length', config['hidden_size'])
    g.add_u32('llama.block_count', config['num_hidden_layers'])
    g.add_u32('llama.feed_forward_length', config['intermediate_size'])
    g.add_u32('llama.attention.head_count', heads)
    g.add_u32('llama.attention.head_count_kv', kv_heads)
    g.add_u32('llama.attention.key_length', head_dim)
    g.add_u32('llama.attention.value_length', head_dim)
    g.add_f32('llama.attention.layer_norm_rms_epsilon', config['rms_norm_eps'])
    g.add_f32('llama.rope.freq_base', config['rope_theta'])
    g.add_u32('llama.rope.dimension_count', head_dim)
    for key, raw in tokenizer_entries.items():
        g.add_raw(key, raw)
    for gguf_name, hf_name in gguf_tensor_names(config['num_hidden_layers']):
        weight = bf16_weights[hf_name]
        if '.attn_q.' in gguf_name:
            weight = rope_rows_to_llama_cpp(weight, heads)
        elif '.attn_k.' in gguf_name:
            weight = rope_rows_to_llama_cpp(weight, kv_heads)
        weight = np.ascontiguousarray(weight, dtype='<u2')
        # Norm weights (1-D) stay F32 in a BF16 file, as llama.cpp's converter keeps them.
        if as_bf16 and weight.ndim > 1:
            g.add_tensor(gguf_name, weight.shape, GGML_BF16, weight.tobytes())
        else:
            widened = (weight.astype('<u4') << 16).view('<f4')
            g.add_tensor(gguf_name, weight.shape, GGML_F32, widened.tobytes())
    g.write(path)


# ---------------------------------------------------------------------------------------------

def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


def stamp_for(kind, tiny_dir, seed):
    with open(os.path.abspath(__file__), 'rb') as f:
        script = hashlib.sha256(f.read()).hexdigest()
    inputs = {name: sha256_of(os.path.join(tiny_dir, name))
              for name in TOKENIZER_FILES + ['config.json', 'model.safetensors', 'model.gguf']}
    stamp = {'kind': kind, 'script_sha256': script, 'tiny_inputs_sha256': inputs,
             'rng': 'torch' if torch is not None else 'numpy'}
    if kind == 'synthetic':
        stamp.update(seed=seed, shape=SYNTHETIC, weight_std=WEIGHT_STD)
    elif kind == 'synthetic-1b':
        stamp.update(seed=seed, shape=SYNTHETIC_1B, weight_std=WEIGHT_STD)
    return stamp


def up_to_date(folder, stamp, files):
    try:
        with open(os.path.join(folder, 'STAMP')) as f:
            if json.load(f) != stamp:
                return False
    except (OSError, ValueError):
        return False
    return all(os.path.isfile(os.path.join(folder, name)) for name in files)


def write_stamp(folder, stamp):
    with open(os.path.join(folder, 'STAMP'), 'w') as f:
        json.dump(stamp, f, indent=1, sort_keys=True)
        f.write('\n')


def random_bf16_weights(config, seed):
    """{HF name: uint16 BF16 bits}: linears and embeddings normal(0, WEIGHT_STD), norms 1."""
    generator = torch.Generator().manual_seed(seed) if torch is not None else None
    hidden, ffn, vocab = config['hidden_size'], config['intermediate_size'], config['vocab_size']
    q_rows = config['num_attention_heads'] * config['head_dim']
    kv_rows = config['num_key_value_heads'] * config['head_dim']
    shapes = [('model.embed_tokens.weight', (vocab, hidden))]
    for layer in range(config['num_hidden_layers']):
        prefix = f'model.layers.{layer}.'
        shapes += [(prefix + 'input_layernorm.weight', (hidden,)),
                   (prefix + 'self_attn.q_proj.weight', (q_rows, hidden)),
                   (prefix + 'self_attn.k_proj.weight', (kv_rows, hidden)),
                   (prefix + 'self_attn.v_proj.weight', (kv_rows, hidden)),
                   (prefix + 'self_attn.o_proj.weight', (hidden, q_rows)),
                   (prefix + 'post_attention_layernorm.weight', (hidden,)),
                   (prefix + 'mlp.gate_proj.weight', (ffn, hidden)),
                   (prefix + 'mlp.up_proj.weight', (ffn, hidden)),
                   (prefix + 'mlp.down_proj.weight', (hidden, ffn))]
    shapes += [('model.norm.weight', (hidden,)), ('lm_head.weight', (vocab, hidden))]
    weights = {}
    numpy_rng = np.random.Generator(np.random.PCG64(seed)) if torch is None else None
    for name, shape in shapes:   # drawn in this fixed order
        if torch is None:
            values = (np.ones(shape, np.float32) if len(shape) == 1 else
                      numpy_rng.normal(0.0, WEIGHT_STD, size=shape).astype(np.float32))
            bits = values.view(np.uint32).astype(np.uint64)
            # Round to nearest even on the upper 16 bits (finite values only, as here).
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            weights[name] = bits.astype('<u2')
            continue
        if len(shape) == 1:
            values = torch.ones(shape)
        else:
            values = torch.empty(shape).normal_(0.0, WEIGHT_STD, generator=generator)
        weights[name] = values.to(torch.bfloat16).view(torch.int16).numpy().view('<u2').copy()
    return weights


def make_synthetic(out_dir, tiny_dir, seed, tokenizer_entries, kind='synthetic'):
    name = 'synthetic-110m' if kind == 'synthetic' else kind
    shape = SYNTHETIC if kind == 'synthetic' else SYNTHETIC_1B
    with_gguf = kind == 'synthetic'
    folder = os.path.join(out_dir, name)
    files = TOKENIZER_FILES + ['config.json', 'model.safetensors']
    if with_gguf:
        files += ['model-f32.gguf', 'model-bf16.gguf']
    stamp = stamp_for(kind, tiny_dir, seed)
    if up_to_date(folder, stamp, files):
        print(f'{folder}: up to date')
        return
    os.makedirs(folder, exist_ok=True)
    if os.path.exists(os.path.join(folder, 'STAMP')):
        os.remove(os.path.join(folder, 'STAMP'))
    with open(os.path.join(tiny_dir, 'config.json')) as f:
        config = json.load(f)
    config.update(shape)
    config.update(torch_dtype='bfloat16', tie_word_embeddings=False, attention_bias=False,
                  rope_scaling=None)
    for file_name in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(tiny_dir, file_name), os.path.join(folder, file_name))
    with open(os.path.join(folder, 'config.json'), 'w') as f:
        json.dump(config, f, indent=2)
        f.write('\n')
    weights = random_bf16_weights(config, seed)
    parameters = sum(w.size for w in weights.values())
    write_safetensors(os.path.join(folder, 'model.safetensors'),
                      {key: (w.shape, w.tobytes()) for key, w in weights.items()})
    if with_gguf:
        for as_bf16, file_name in [(False, 'model-f32.gguf'), (True, 'model-bf16.gguf')]:
            write_llama_gguf(os.path.join(folder, file_name), config, name, weights,
                             tokenizer_entries, as_bf16)
    write_stamp(folder, stamp)
    print(f'{folder}: {parameters} parameters written')


def make_tiny_bf16(out_dir, tiny_dir, tokenizer_entries):
    folder = os.path.join(out_dir, 'tiny-llama')
    stamp = stamp_for('tiny-bf16', tiny_dir, None)
    if up_to_date(folder, stamp, ['model-bf16.gguf']):
        print(f'{folder}: up to date')
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(tiny_dir, 'config.json')) as f:
        config = json.load(f)
    weights = read_safetensors_bf16(os.path.join(tiny_dir, 'model.safetensors'))
    write_llama_gguf(os.path.join(folder, 'model-bf16.gguf'), config, 'tiny-llama', weights,
                     tokenizer_entries, as_bf16=True)
    write_stamp(folder, stamp)
    print(f'{folder}: model-bf16.gguf written')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out_dir')
    parser.add_argument('--tiny-dir', required=True, help='the shared tiny-llama checkpoint folder')
    parser.add_argument('--seed', type=int, default=20261201)
    parser.add_argument('--models', default='tiny-bf16,synthetic',
                        help='comma-separated: tiny-bf16, synthetic, synthetic-1b')
    args = parser.parse_args()
    wanted = [m for m in args.models.split(',') if m]
    if torch is None and any(m != 'synthetic-1b' for m in wanted):
        fail('python3-torch is needed for tiny-bf16 and synthetic (only synthetic-1b can use numpy)')
    for model in wanted:
        if model not in ('tiny-bf16', 'synthetic', 'synthetic-1b'):
            fail(f'unknown model {model!r} (tiny-bf16, synthetic, synthetic-1b)')
    for name in TOKENIZER_FILES + ['config.json', 'model.safetensors', 'model.gguf']:
        if not os.path.isfile(os.path.join(args.tiny_dir, name)):
            fail(f'{args.tiny_dir} has no {name} (pass the tiny-llama checkpoint with --tiny-dir)')
    entries = read_gguf_entries(os.path.join(args.tiny_dir, 'model.gguf'))
    tokenizer_entries = {k: v for k, v in entries.items() if k.startswith('tokenizer.')}
    if 'tokenizer.ggml.tokens' not in tokenizer_entries:
        fail(f'{args.tiny_dir}/model.gguf has no tokenizer metadata')
    os.makedirs(args.out_dir, exist_ok=True)
    if 'tiny-bf16' in wanted:
        make_tiny_bf16(args.out_dir, args.tiny_dir, tokenizer_entries)
    for kind in ('synthetic', 'synthetic-1b'):
        if kind in wanted:
            make_synthetic(args.out_dir, args.tiny_dir, args.seed, tokenizer_entries, kind)


if __name__ == '__main__':
    main()
