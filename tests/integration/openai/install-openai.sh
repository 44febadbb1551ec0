#!/usr/bin/env bash
# Installs the official `openai` npm package (pinned) for the proxy's OpenAI-client test
# (openai_client_test.mjs, run by openai_proxy_test), into DIR/node_modules:
#   tests/integration/openai/install-openai.sh [DIR]     (default: build/openai-node)
# openai_proxy_test skips that case until it is installed. Nothing is fetched when the pinned
# version is already there. Needs node and npm (apt-get install nodejs npm) and the npm registry.
set -euo pipefail
OPENAI_VERSION="7.59.0"
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
dir="${1:-$repo/build/openai-node}"
for tool in node npm; do
  if ! command -v "$tool" >/dev/null; then
    echo "install-openai: $tool not found; install Node.js and npm first (apt-get install nodejs npm)" >&2
    exit 1
  fi
done
mkdir -p "$dir"
cd "$dir"
installed="$(node -e 'try { console.log(require(process.argv[1]).version) } catch (e) {}' \
  "$PWD/node_modules/openai/package.json" 2>/dev/null || true)"
if [ "$installed" = "$OPENAI_VERSION" ]; then
  echo "openai $OPENAI_VERSION already installed in $dir"
  exit 0
fi
# A private package.json so npm does not ask for a name, version or licence.
[ -f package.json ] || echo '{ "name": "cloister-openai-test", "private": true }' > package.json
# openai declares node >= 22 but runs on Debian's node 20 for what the test uses.
npm install --no-audit --no-fund --save-exact --ignore-scripts "openai@$OPENAI_VERSION"
installed="$(node -e 'console.log(require(process.argv[1]).version)' \
  "$PWD/node_modules/openai/package.json")"
if [ "$installed" != "$OPENAI_VERSION" ]; then
  echo "install-openai: openai $OPENAI_VERSION did not install (found $installed)" >&2
  exit 1
fi
echo "installed openai $OPENAI_VERSION in $dir"
