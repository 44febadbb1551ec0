#!/usr/bin/env bash
# Installs the independent tokenizer reference, transformers.js (@huggingface/transformers, pinned),
# into tests/conformance/llm/node_modules (git-ignored), for regenerating the tokenizer goldens:
#   scripts/install-reference-deps.sh
#   node tests/conformance/llm/tokenizer_reference.mjs enclave/llm/testdata/tokenizers \
#       enclave/llm/testdata/tokenizers/* /PATH/TO/models/llm/tiny-llama
# --ignore-scripts: the tokenizer needs no ONNX runtime, whose install script would download one.
set -euo pipefail
cd "$(dirname "$0")/../tests/conformance/llm"
if [ ! -f package.json ]; then
  cat > package.json <<'JSON'
{ "name": "cloister-llm-conformance", "private": true, "type": "module" }
JSON
fi
npm install --no-save --no-package-lock --ignore-scripts -E @huggingface/transformers@4.3.1
