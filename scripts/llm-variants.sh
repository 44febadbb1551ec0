#!/usr/bin/env bash
# Checks the LLM engine on the architecture variants the issue lists and the shared tiny model
# does not cover: Qwen2 (q/k/v bias, tied embeddings, rope theta 1e6), Mistral with a
# SentencePiece-BPE tokenizer, Llama with Llama-3.1 rope scaling, and a tied Llama with a
# SentencePiece tokenizer. Each is a small model trained for a few steps by the shared generator
# (../shared/models/llm/make_tiny_llm.py), whose own float32 torch model writes the references
# (greedy ids, last-position logits, tokenizer checks) that the engine must reproduce.
#
#   scripts/llm-variants.sh TEST_BINARY [CACHE_DIR]
#
# Needs Debian's python3-torch, python3-numpy, python3-sentencepiece, fortunes and fortunes-min
# (installed when missing). The models are generated once into CACHE_DIR (default
# build/llm-variants) and never committed; ctest runs this as llm_architecture_variants (label
# slow).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
test_binary="$1"
cache="${2:-$root/build/llm-variants}"
generator="${CLOISTER_SHARED_DIR:-$root/../shared}/models/llm/make_tiny_llm.py"

packages=(python3-torch python3-numpy python3-sentencepiece fortunes fortunes-min)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

small=(--steps 40 --hidden 64 --layers 2 --heads 4 --kv-heads 2 --ffn 160 --vocab 600 --threads 1)
variants=(
  "qwen2|--arch qwen2"
  "mistral_sp|--arch mistral --tokenizer sp-bpe"
  "llama3_rope|--rope-scaling llama3 --rope-factor 8 --low-freq-factor 1 --high-freq-factor 4 --original-max-pos 64 --max-pos 256"
  "llama_sp_tied|--tokenizer sp-bpe --tie-embeddings yes"
)
mkdir -p "$cache"
for v in "${variants[@]}"; do
  name="${v%%|*}"
  args="${v#*|}"
  stamp="$cache/$name/.made-with"
  want="$args ${small[*]}"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then continue; fi
  rm -rf "${cache:?}/$name"
  # shellcheck disable=SC2086
  /usr/bin/python3 "$generator" "$cache/$name" $args "${small[@]}" > "$cache/$name.log" 2>&1 ||
    { echo "llm-variants: generating $name failed; see $cache/$name.log" >&2; exit 1; }
  echo "$want" > "$stamp"
done
CLOISTER_LLM_VARIANTS_DIR="$cache" exec "$test_binary" \
  --gtest_filter='TinyModelTest.ArchitectureVariantsMatchTheirReferences'
