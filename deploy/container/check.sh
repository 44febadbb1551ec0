#!/usr/bin/env bash
# Plays Cloister's deployment for real with podman, step by step, as an operator would:
#
#   deploy/container/check.sh --bin DIR --shared DIR [--image cloister:TAG]
#                             [--ccache-dir DIR | --ccache-dir-from-host] [--keep]
#
#   build      a fresh clone of this repository's HEAD, built into an image by build.sh
#              (skipped with --image); then the image is inspected: under 400 MB, no compiler,
#              no -dev package, no test data, a non-root user
#   appliance  the image on its embedded default with a host folder as its volume (:U): the
#              README's CLI round trip from the host against the published port (attest,
#              upload, models, infer, compared with the model's reference output), and a
#              greedy generation of the shared tiny LLM compared with its reference text
#   canary     a marker sent in a prompt, and bytes of the uploaded model, are searched for in
#              the volume and in the container's logs: neither may be there
#   restart    SIGTERM (podman stop) ends cloisterd and its worker with exit 0; the started
#              container serves both models again without a new upload
#   kube       the Kubernetes base, rendered by deploy/tools/render.py --for podman with a fresh
#              TLS key pair in its Secret, started with `podman kube play`: the probe answers,
#              the ConfigMap's config and the Secret's certificate are in force (the CLI attests
#              over TLS as the config's tenant), an upload and an inference pass
#   fleet      two appliances from the image with one simulated machine identity: two clients
#              with the endpoints in opposite orders land one on each, and so do two identity
#              keys with one list and CLOISTER_SPREAD=1; a `cloister chat` on the first node
#              carries on on the survivor when its container is stopped
#
# --ccache-dir gives the image's build stage a compiler cache (--ccache-dir-from-host: this
# machine's own, so a tree built here compiles again in seconds). DIR for --bin holds the
# host's `cloister` and `tensor-to-npy` (a build's bin/); --shared is the shared models
# folder's parent. Each step prints `check.sh: STEP ok (...)`; a failed step
# prints the command and its output and exits 1. Exit 77 (skipped, with the reason) where podman
# cannot run containers here. Uses CONTAINERS_CONF=deploy/container/containers.conf unless set.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"

bin="" shared="" image="" ccache_dir="" keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin="$(cd "$2" && pwd)"; shift 2 ;;
    --shared) shared="$(cd "$2" && pwd)"; shift 2 ;;
    --image) image="$2"; shift 2 ;;
    --ccache-dir) ccache_dir="$2"; shift 2 ;;
    --ccache-dir-from-host)  # this machine's ccache, shared with the image's build stage
      ccache_dir="$(ccache -k cache_dir 2>/dev/null || true)"; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$bin" ] || [ -z "$shared" ]; then
  echo "check.sh: --bin DIR and --shared DIR are required (see --help)" >&2
  exit 2
fi
for tool in "$bin/cloister" "$bin/tensor-to-npy"; do
  [ -x "$tool" ] || { echo "check.sh: $tool is missing (build the project first)" >&2; exit 2; }
done
python=/usr/bin/python3
[ -x "$python" ] || python=python3

skip() { echo "check.sh: skipped: $*"; exit 77; }
command -v podman >/dev/null || skip "podman is not installed (apt-get install podman runc mmdebstrap uidmap catatonit)"
if ! podman info >/dev/null 2>&1; then
  skip "podman cannot start here: $(podman info 2>&1 | tail -n 1)"
fi
if [ "$(id -u)" -ne 0 ] && ! grep -q "^$(id -un):" /etc/subuid 2>/dev/null; then
  skip "no user namespaces for $(id -un) (no /etc/subuid entry)"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/cloister-check.XXXXXX")"
# The volumes' files belong to the image's user: root reads them as they are, a rootless
# podman user through `podman unshare` (its user namespace).
owner=()
[ "$(id -u)" -ne 0 ] && owner=(podman unshare)
suffix="$$"
containers=()
kube_file=""
cleanup() {
  if [ "$keep" = 1 ]; then
    echo "check.sh: kept $work and containers ${containers[*]:-none}" >&2
    return
  fi
  if [ -n "$kube_file" ]; then
    podman kube down "$kube_file" >/dev/null 2>&1 || true
    for v in ${config_volumes:-}; do podman volume rm -f "$v" >/dev/null 2>&1 || true; done
  fi
  for c in "${containers[@]}"; do podman rm -f -t 5 "$c" >/dev/null 2>&1 || true; done
  # Files in the volumes belong to the container's user; podman unshare removes them rootless.
  rm -rf "$work" 2>/dev/null || podman unshare rm -rf "$work" || true
}
trap cleanup EXIT

fail() {
  echo "check.sh: $step failed: $*" >&2
  exit 1
}

# run CMD...: runs CMD; on failure names the step, the command and its output, and exits 1.
run() {
  local log="$work/last.log"
  if ! "$@" >"$log" 2>&1; then
    echo "check.sh: $step failed: $*" >&2
    tail -n 80 "$log" >&2
    exit 1
  fi
  cat "$log"
}

free_port() {
  "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_listening CONTAINER SINCE: waits (up to 180 s) for cloisterd's ready line in the
# container's logs; prints the seconds since SINCE (an epoch with nanoseconds).
wait_listening() {
  local container="$1" since="$2" deadline=$((SECONDS + 180)) count
  count="$(podman logs "$container" 2>&1 | grep -c 'cloisterd listening on' || true)"
  local want=$((count + 1))
  [ "${3:-}" = "first" ] && want=1
  while [ $SECONDS -lt $deadline ]; do
    count="$(podman logs "$container" 2>&1 | grep -c 'cloisterd listening on' || true)"
    if [ "$count" -ge "$want" ]; then
      "$python" -c "import time; print(f'{time.time() - $since:.1f}')"
      return 0
    fi
    if [ "$(podman inspect --format '{{.State.Running}}' "$container" 2>/dev/null)" != "true" ]; then
      echo "check.sh: $step failed: container $container stopped before listening" >&2
      podman logs "$container" 2>&1 | tail -n 40 >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "check.sh: $step failed: $container not listening after 180 s" >&2
  podman logs "$container" 2>&1 | tail -n 40 >&2
  exit 1
}

now() { "$python" -c 'import time; print(time.time())'; }

# logs_have CONTAINER TEXT: whether the container's logs hold TEXT (read whole: with pipefail,
# `podman logs | grep -q` fails when grep stops reading early).
logs_have() {
  podman logs "$1" >"$work/logs.tmp" 2>&1
  grep -qF -- "$2" "$work/logs.tmp"
}

cls_model="$shared/models/ocr/ch_ppocr_mobile_v2.0_cls_infer.onnx"
cls_data="$shared/models/testdata/ch_ppocr_mobile_v2.0_cls/test_data_set_0"
tiny="$shared/models/llm/tiny-llama"
for f in "$cls_model" "$cls_data/input_0.pb" "$cls_data/output_0.pb" "$tiny/reference.json"; do
  [ -e "$f" ] || { echo "check.sh: $f is missing (--shared)" >&2; exit 2; }
done
run "$bin/tensor-to-npy" "$cls_data/input_0.pb" "$work/x.npy" >/dev/null
run "$bin/tensor-to-npy" "$cls_data/output_0.pb" "$work/expected.npy" >/dev/null
"$python" - "$tiny/reference.json" "$work/chat.json" "$work/expected.txt" <<'EOF'
import json, sys
prompt = json.load(open(sys.argv[1]))["prompts"][0]
json.dump(prompt["messages"], open(sys.argv[2], "w"))
open(sys.argv[3], "w").write(prompt["generated_text"])
EOF

# cli ENV_FILE ARGS...: the host's CLI with the connection settings in ENV_FILE.
cli() {
  local env_file="$1"; shift
  (set -a; . "$env_file"; set +a; "$bin/cloister" "$@")
}

# round_trip ENV_FILE LABEL: upload the classifier and the tiny LLM, infer, generate, compare.
round_trip() {
  local env="$1" label="$2"
  run cli "$env" attest >/dev/null
  run cli "$env" upload --model "$cls_model" --name cls >/dev/null
  run cli "$env" upload --model "$tiny" --name tiny >/dev/null
  local models
  models="$(run cli "$env" models)"
  grep -q '^cls\b\|"cls"\| cls ' <<<"$models" || fail "cloister models lacks cls: $models"
  check_models "$env" "$label"
}

# check_models ENV_FILE LABEL: infer and generate with what is uploaded, against the references.
check_models() {
  local env="$1" label="$2"
  rm -rf "$work/out-$label"
  run cli "$env" infer --model cls --input x="$work/x.npy" --output-dir "$work/out-$label" >/dev/null
  run "$python" - "$work/out-$label" "$work/expected.npy" <<'EOF'
import glob, sys
import numpy as np
out = glob.glob(sys.argv[1] + "/*.npy")
assert len(out) == 1, f"expected one output, got {out}"
got, want = np.load(out[0]), np.load(sys.argv[2])
assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
assert np.allclose(got, want, atol=1e-4), f"max diff {np.abs(got - want).max()}"
EOF
  run cli "$env" generate --model tiny --chat "$work/chat.json" --temperature 0 --json \
    >"$work/gen-$label.json"
  run "$python" - "$work/gen-$label.json" "$work/expected.txt" <<'EOF'
import json, sys
got = json.load(open(sys.argv[1]))["text"]
want = open(sys.argv[2]).read()
assert got == want, f"generated {got!r}, reference {want!r}"
EOF
}

started_all=$(date +%s)

# ---- build ----
step=build
if [ -z "$image" ]; then
  run git clone --quiet "$root" "$work/src" >/dev/null
  build_args=(--tag "check-$suffix")
  [ -n "$ccache_dir" ] && build_args+=(--ccache-dir "$ccache_dir")
  build_out="$(run "$work/src/deploy/container/build.sh" "${build_args[@]}")"
  echo "$build_out" | sed 's/^/  /'
  image="$(tail -n 1 <<<"$build_out")"
  built_image=1
fi
podman image exists "$image" || fail "no image $image"
size="$(podman image inspect --format '{{.Size}}' "$image")"
[ "$size" -lt 400000000 ] || fail "$image is $((size / 1000000)) MB, over 400 MB"
inventory="$(run podman run --rm --entrypoint /bin/sh "$image" -c '
  for c in cc gcc g++ c++ clang cpp as ld cmake make; do command -v "$c" && echo "compiler: $c"; done
  dpkg-query -W -f "\${Package}\n" | grep -- "-dev$" | sed "s/^/dev package: /"
  find / -xdev \( -name "*.onnx" -o -name "*.safetensors" -o -name "*.gguf" -o -name "*.npy" \
       -o -name testdata -o -name "*_test" \) -print 2>/dev/null | sed "s/^/test data: /"
  echo "user: $(id -u)"')"
if grep -q '^compiler: \|^dev package: \|^test data: ' <<<"$inventory"; then
  fail "the image holds what it should not: $(grep '^compiler: \|^dev package: \|^test data: ' <<<"$inventory" | tr '\n' ';')"
fi
grep -q '^user: 10001$' <<<"$inventory" || fail "the image does not run as user 10001: $inventory"
echo "check.sh: build ok ($image, $((size / 1000000)) MB, no compiler, no -dev package, no test data, user 10001)"

# ---- appliance ----
step=appliance
mkdir -p "$work/data-a"
port_a="$(free_port)"
c_a="cloister-check-a-$suffix"
containers+=("$c_a")
t0="$(now)"
run podman run -d --name "$c_a" -p "127.0.0.1:$port_a:7700" \
  -v "$work/data-a:/var/lib/cloister:U" "$image" >/dev/null
startup="$(wait_listening "$c_a" "$t0" first)"
for f in dev-policy.yaml demo.token; do
  [ -s "$work/data-a/$f" ] || fail "$f did not appear in the volume"
done
cat >"$work/env-a" <<EOF
CLOISTER_SERVER=127.0.0.1:$port_a
CLOISTER_TENANT=demo
CLOISTER_POLICY=$work/data-a/dev-policy.yaml
CLOISTER_TOKEN_FILE=$work/demo.token
CLOISTER_KEY=$work/demo.key
EOF
"${owner[@]}" cat "$work/data-a/demo.token" >"$work/demo.token"
run cli "$work/env-a" keygen >/dev/null
round_trip "$work/env-a" a
echo "check.sh: appliance ok (listening ${startup} s after podman run; attest, upload, infer and generate match the references)"

# ---- canary ----
step=canary
marker="cloister-canary-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
run cli "$work/env-a" generate --model tiny --prompt "Remember the word $marker please" \
  --max-tokens 4 >/dev/null
podman logs "$c_a" >"$work/logs-a.txt" 2>&1
run "${owner[@]}" "$python" - "$work/data-a" "$work/logs-a.txt" "$marker" "$cls_model" <<'EOF'
import os, sys
folder, logs, marker, model = sys.argv[1:5]
blob = open(model, "rb").read()
markers = {"prompt marker": marker.encode(),
           # bytes from the middle of the model's weights (the plaintext model)
           "model bytes": blob[len(blob) // 2:len(blob) // 2 + 48]}
paths = [logs] + [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs]
found = []
for path in paths:
    data = open(path, "rb").read()
    for what, m in markers.items():
        if m in data:
            found.append(f"{what} in {path}")
assert not found, "; ".join(found)
print(f"scanned {len(paths)} files")
EOF
echo "check.sh: canary ok (neither the prompt marker nor the model's bytes in the volume or the logs)"

# ---- restart ----
step=restart
t0="$(now)"
run podman stop -t 30 "$c_a" >/dev/null
stop_s="$("$python" -c "import time; print(f'{time.time() - $t0:.1f}')")"
code="$(podman inspect --format '{{.State.ExitCode}}' "$c_a")"
[ "$code" = 0 ] || fail "cloisterd exited with $code after SIGTERM: $(podman logs "$c_a" 2>&1 | tail -n 5)"
for event in '"event":"shutting_down","signal":15' '"event":"enclave_worker_stopped"' \
             '"event":"stopped","exit_code":0'; do
  logs_have "$c_a" "$event" || fail "no $event line in the logs after SIGTERM"
done
t0="$(now)"
run podman start "$c_a" >/dev/null
restart_s="$(wait_listening "$c_a" "$t0")"
check_models "$work/env-a" a-restarted
echo "check.sh: restart ok (stopped with exit 0 in ${stop_s} s; listening again ${restart_s} s after start; both models served without a new upload)"

# ---- kube ----
step=kube
port_k="$(free_port)"
run openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=cloister-check" -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
  -keyout "$work/tls.key" -out "$work/tls.crt" >/dev/null
kube_file="$work/kube.yaml"
run "$python" "$root/deploy/tools/render.py" "$root/deploy/kubernetes/base" --for podman \
  --image "cloister=$image" --secret-file "cloister-tls/tls.crt=$work/tls.crt" \
  --secret-file "cloister-tls/tls.key=$work/tls.key" --publish "tenant=$port_k" \
  --secret-host-dir "$work/secrets" \
  -o "$kube_file" >/dev/null
# kube play keeps each ConfigMap as a named volume and reuses one that exists: a leftover
# would bring an old config.
config_volumes="$("$python" -c '
import sys, yaml
print(" ".join(o["metadata"]["name"] for o in yaml.safe_load_all(open(sys.argv[1]))
               if o and o.get("kind") == "ConfigMap"))' "$kube_file")"
for v in $config_volumes; do
  if podman volume exists "$v"; then
    fail "podman volume $v exists (left by an earlier kube play: podman kube down it, then podman volume rm $v)"
  fi
done
t0="$(now)"
run podman kube play "$kube_file" >/dev/null
c_k="$(podman ps -a --filter "label=app.kubernetes.io/name=cloisterd" --format '{{.Names}}' \
  | grep -v infra | head -n 1)"
[ -n "$c_k" ] || c_k="$(podman ps -a --format '{{.Names}}' | grep '^cloisterd-pod' | grep -v infra | head -n 1)"
[ -n "$c_k" ] || fail "kube play started no cloisterd container: $(podman ps -a --format '{{.Names}} {{.Status}}')"
kube_startup="$(wait_listening "$c_k" "$t0" first)"
deadline=$((SECONDS + 60))
until podman healthcheck run "$c_k" >/dev/null 2>&1; do
  [ $SECONDS -lt $deadline ] || fail "the probe of $c_k never answered: $(podman healthcheck run "$c_k" 2>&1)"
  sleep 1
done
logs_have "$c_k" 'cloisterd listening on 0.0.0.0:7700' \
  || fail "cloisterd in the pod is not on the ConfigMap's address: $(podman logs "$c_k" 2>&1 | tail -n 3)"
run podman cp "$c_k:/var/lib/cloister/dev-policy.yaml" "$work/kube-policy.yaml" >/dev/null
printf 'test' >"$work/acme.token"
cat >"$work/env-k" <<EOF
CLOISTER_SERVER=127.0.0.1:$port_k
CLOISTER_TENANT=acme
CLOISTER_POLICY=$work/kube-policy.yaml
CLOISTER_TOKEN_FILE=$work/acme.token
CLOISTER_KEY=$work/demo.key
CLOISTER_CA=$work/tls.crt
EOF
run cli "$work/env-k" attest >/dev/null
run cli "$work/env-k" upload --model "$cls_model" --name cls >/dev/null
rm -rf "$work/out-k"
run cli "$work/env-k" infer --model cls --input x="$work/x.npy" --output-dir "$work/out-k" >/dev/null
# Without the CA the TLS handshake must fail: the Secret's certificate is what is served.
if (set -a; . "$work/env-k"; unset CLOISTER_CA; "$bin/cloister" attest) >"$work/plain.log" 2>&1; then
  fail "a plaintext client attested: the pod does not serve the Secret's TLS certificate"
fi
run podman kube down "$kube_file" >/dev/null
kube_file=""
for v in $config_volumes; do podman volume rm -f "$v" >/dev/null 2>&1 || true; done
echo "check.sh: kube ok (kube play: listening ${kube_startup} s after play, probe answers, TLS from the Secret, config from the ConfigMap, upload and infer as tenant acme)"

# ---- fleet ----
step=fleet
mkdir -p "$work/data-b" "$work/data-c"
# One simulated machine identity for both, so that one development policy trusts the fleet
# (real TEEs: the policy pins the vendor's roots, which every machine chains to)
# (and one development token, so that one token file serves the fleet's tenant demo).
for d in data-b data-c; do
  run "${owner[@]}" cp -a "$work/data-a/sim" "$work/data-a/demo.token" "$work/$d/" >/dev/null
done
port_b="$(free_port)"
port_c="$(free_port)"
c_b="cloister-check-b-$suffix"
c_c="cloister-check-c-$suffix"
containers+=("$c_b" "$c_c")
t0="$(now)"
run podman run -d --name "$c_b" -p "127.0.0.1:$port_b:7700" -v "$work/data-b:/var/lib/cloister:U" "$image" >/dev/null
run podman run -d --name "$c_c" -p "127.0.0.1:$port_c:7700" -v "$work/data-c:/var/lib/cloister:U" "$image" >/dev/null
wait_listening "$c_b" "$t0" first >/dev/null
wait_listening "$c_c" "$t0" first >/dev/null
cmp -s "$work/data-b/dev-policy.yaml" "$work/data-c/dev-policy.yaml" \
  || fail "the two appliances' development policies differ"
for p in "$port_b" "$port_c"; do
  sed "s/^CLOISTER_SERVER=.*/CLOISTER_SERVER=127.0.0.1:$p/; s#data-a/dev-policy#data-b/dev-policy#" "$work/env-a" >"$work/env-$p"
  run cli "$work/env-$p" upload --model "$tiny" --name tiny >/dev/null
done
sed "s/^CLOISTER_SERVER=.*/CLOISTER_SERVER=127.0.0.1:$port_b,127.0.0.1:$port_c/; s#data-a/dev-policy#data-b/dev-policy#" "$work/env-a" >"$work/env-bc"
sed "s/^CLOISTER_SERVER=.*/CLOISTER_SERVER=127.0.0.1:$port_c,127.0.0.1:$port_b/; s#data-a/dev-policy#data-b/dev-policy#" "$work/env-a" >"$work/env-cb"
sessions() { podman logs "$1" 2>&1 | grep -c '"session_opened"' || true; }
b0="$(sessions "$c_b")" c0="$(sessions "$c_c")"
run cli "$work/env-bc" generate --model tiny --prompt "one" --max-tokens 2 >/dev/null
run cli "$work/env-cb" generate --model tiny --prompt "two" --max-tokens 2 >/dev/null
b1="$(sessions "$c_b")" c1="$(sessions "$c_c")"
[ "$b1" -gt "$b0" ] && [ "$c1" -gt "$c0" ] \
  || fail "the clients did not spread: sessions on b $b0 -> $b1, on c $c0 -> $c1"
# One list for everyone with CLOISTER_SPREAD=1: two identity keys that pick different nodes
# (the pick is the key's SHA-256, first 8 bytes, modulo 2) upload and generate each on its own.
declare -A spread_key=()
for i in $(seq 1 32); do
  public="$(run cli "$work/env-bc" keygen --key "$work/spread-$i.key" | sed -n 's/^public key: //p')"
  pick="$("$python" -c 'import hashlib, sys
print(int.from_bytes(hashlib.sha256(bytes.fromhex(sys.argv[1])).digest()[:8], "big") % 2)' "$public")"
  [ -n "${spread_key[$pick]:-}" ] || spread_key[$pick]="$work/spread-$i.key"
  [ "${#spread_key[@]}" -eq 2 ] && break
done
[ "${#spread_key[@]}" -eq 2 ] || fail "32 keys did not pick both nodes"
for pick in 0 1; do
  node="$c_b"; [ "$pick" = 1 ] && node="$c_c"
  before="$(sessions "$node")"
  sed "s#^CLOISTER_KEY=.*#CLOISTER_KEY=${spread_key[$pick]}#" "$work/env-bc" >"$work/env-spread-$pick"
  echo "CLOISTER_SPREAD=1" >>"$work/env-spread-$pick"
  run cli "$work/env-spread-$pick" upload --model "$tiny" --name tiny >/dev/null
  run cli "$work/env-spread-$pick" generate --model tiny --prompt "spread" --max-tokens 2 >/dev/null
  after="$(sessions "$node")"
  [ "$after" -ge $((before + 2)) ] \
    || fail "the key that picks node $pick did not land there (sessions on $node $before -> $after)"
done
# A long-lived client on b,c: one turn on b, then b stops and the conversation carries on.
mkfifo "$work/chat.in"
(set -a; . "$work/env-bc"; set +a
 exec "$bin/cloister" chat --model tiny --temperature 0 --max-tokens 6 <"$work/chat.in" \
   >"$work/chat.out" 2>"$work/chat.err") &
chat_pid=$!
exec 7>"$work/chat.in"
turn() {  # turn TEXT: sends one line, waits up to 60 s for one more reply line
  local before after deadline=$((SECONDS + 60))
  before="$(wc -l <"$work/chat.out")"
  echo "$1" >&7
  while [ $SECONDS -lt $deadline ]; do
    after="$(wc -l <"$work/chat.out")"
    [ "$after" -gt "$before" ] && return 0
    grep -q . "$work/chat.err" && [ "$(wc -l <"$work/chat.err")" -gt "${2:-0}" ] && return 1
    sleep 0.3
  done
  return 1
}
turn "first turn" || fail "no reply on b: $(cat "$work/chat.err")"
c2="$(sessions "$c_c")"
run podman stop -t 30 "$c_b" >/dev/null
replied=0
for attempt in 1 2 3; do
  errors="$(wc -l <"$work/chat.err")"
  if turn "turn after b stopped ($attempt)" "$errors"; then replied=1; break; fi
done
exec 7>&-
wait "$chat_pid" || true
[ "$replied" = 1 ] || fail "the chat did not carry on on c: $(cat "$work/chat.err")"
c3="$(sessions "$c_c")"
[ "$c3" -gt "$c2" ] || fail "no new session on c after b stopped"
failed_turns="$(wc -l <"$work/chat.err")"
echo "check.sh: fleet ok (clients spread over b and c, by order and by CLOISTER_SPREAD; after b stopped the chat re-attested c and carried on, $failed_turns turn(s) refused meanwhile)"

echo "check.sh: all steps ok in $(( $(date +%s) - started_all )) s (image $image, $((size / 1000000)) MB, first start ${startup} s)"
if [ "${built_image:-0}" = 1 ] && [ "$keep" = 0 ]; then
  podman rmi "$image" >/dev/null 2>&1 || true
fi
