#!/usr/bin/env bash
# Installs the independent references: transformers.js (@huggingface/transformers, pinned) for the
# tokenizer and @huggingface/jinja (pinned) for chat templates,
# into tests/conformance/llm/node_modules (git-ignored), for regenerating the goldens:
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
# The chat-template reference, @huggingface/jinja (pinned), for chat_template_reference.mjs:
#   node tests/conformance/llm/chat_template_reference.mjs enclave/llm/testdata/chat_templates
# Both packages go in one npm command: npm prunes what it was not asked for, so two --no-save
# installs would remove each other. Nothing is fetched when both pinned versions are present.
JINJA_VERSION="0.5.11"
TRANSFORMERS_VERSION="4.3.1"
installed_version() {
  node -e 'try { console.log(require(process.argv[1]).version) } catch (e) {}' \
    "$PWD/node_modules/$1/package.json" 2>/dev/null || true
}
if [ "$(installed_version @huggingface/transformers)" = "$TRANSFORMERS_VERSION" ] &&
   [ "$(installed_version @huggingface/jinja)" = "$JINJA_VERSION" ] &&
   [ -f node_modules/@huggingface/jinja/dist/index.js ]; then
  echo "@huggingface/transformers $TRANSFORMERS_VERSION and @huggingface/jinja $JINJA_VERSION already installed"
  exit 0
fi
npm install --no-save --no-package-lock --ignore-scripts -E \
  "@huggingface/transformers@$TRANSFORMERS_VERSION" "@huggingface/jinja@$JINJA_VERSION"
if [ "$(installed_version @huggingface/jinja)" != "$JINJA_VERSION" ]; then
  echo "install-reference-deps: @huggingface/jinja $JINJA_VERSION did not install" >&2
  exit 1
fi
