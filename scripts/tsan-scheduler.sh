#!/usr/bin/env bash
# ThreadSanitizer run of cloisterd's scheduler core (host/scheduler) and its unit tests.
#
# The distribution's abseil is built without TSan, so its Mutex, CondVar and Notification are
# invisible to it and a plain -fsanitize=thread build reports every handover through them. This
# script therefore:
#   1. installs the packages it needs (apt, when run as root and something is missing);
#   2. once: fetches the distribution's abseil source (the version of the installed libabsl-dev,
#      with its patches), builds it with -fsanitize=thread as static libraries and installs them
#      under build-tsan-deps/abseil (kept; later runs reuse it);
#   3. builds scripts/tsan (the scheduler, its tests, the scheduler-overhead load driver and the
#      enclave's TaskPool with its tests, all instrumented) in build-tsan;
#   4. runs the unit tests repeatedly in shuffled order, then the load driver, and counts TSan
#      reports.
# Exit status: 0 only when every run passed and TSan reported nothing.
#
# Environment: JOBS (parallel compile jobs, default 2), TSAN_REPEAT (test repeats, default 20),
# CLOISTER_TSAN_DEPS and CLOISTER_TSAN_BUILD (folders, default build-tsan-deps and build-tsan in
# the checkout).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="${CLOISTER_TSAN_DEPS:-${root}/build-tsan-deps}"
build="${CLOISTER_TSAN_BUILD:-${root}/build-tsan}"
jobs="${JOBS:-2}"
repeat="${TSAN_REPEAT:-20}"
absl_prefix="${deps}/abseil"

say() { echo "tsan-scheduler: $*"; }
die() { echo "tsan-scheduler: $*" >&2; exit 2; }

# --- 1. packages ------------------------------------------------------------------------------
packages=(g++ cmake ninja-build dpkg-dev libabsl-dev libprotobuf-dev protobuf-compiler libssl-dev
          googletest)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "${package}" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("${package}")
done
if ((${#missing[@]})); then
  [[ $(id -u) -eq 0 ]] || die "missing packages (install them as root): ${missing[*]}"
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- 2. instrumented abseil (once) ------------------------------------------------------------
# The source package that the installed libabsl-dev was built from, so that its configuration
# (options.h: abseil's own string_view/optional, inline namespace) is the one the code expects.
absl_version="$(dpkg-query -W -f='${source:Version}' libabsl-dev)"
stamp="${absl_prefix}/.built-${absl_version}"
if [[ ! -f "${stamp}" ]]; then
  say "building abseil ${absl_version} with -fsanitize=thread (once; 2 to 6 minutes on 2 cores)"
  src="${deps}/src"
  rm -rf "${src}" "${deps}/abseil-build" "${absl_prefix}"
  mkdir -p "${src}"
  if ! (cd "${src}" && apt-get source --download-only "abseil=${absl_version}" >/dev/null 2>&1); then
    # No deb-src entry: add one beside each Debian deb entry, then try again.
    [[ $(id -u) -eq 0 ]] || die "apt has no deb-src entry for abseil; add one (as root) and rerun"
    say "adding deb-src entries for the Debian archives"
    list=/etc/apt/sources.list.d/cloister-deb-src.sources
    : >"${list}.new"
    for file in /etc/apt/sources.list.d/*.sources; do
      [[ "${file}" == "${list}" ]] && continue
      grep -q "^URIs:.*debian" "${file}" || continue
      sed -e 's/^Types: deb$/Types: deb-src/' "${file}" >>"${list}.new"
      echo >>"${list}.new"
    done
    if grep -qE '^deb .*debian' /etc/apt/sources.list 2>/dev/null; then
      grep -E '^deb .*debian' /etc/apt/sources.list | sed -e 's/^deb /deb-src /' \
        >/etc/apt/sources.list.d/cloister-deb-src.list
    fi
    mv "${list}.new" "${list}"
    apt-get update -qq
    (cd "${src}" && apt-get source --download-only "abseil=${absl_version}" >/dev/null)
  fi
  # Unpacks and applies the Debian patches.
  (cd "${src}" && dpkg-source --no-check -x ./abseil_*.dsc abseil >/dev/null)
  cmake -S "${src}/abseil" -B "${deps}/abseil-build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
    -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON -DBUILD_SHARED_LIBS=OFF \
    -DBUILD_TESTING=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DCMAKE_INSTALL_PREFIX="${absl_prefix}" >"${deps}/abseil-configure.log"
  ninja -C "${deps}/abseil-build" -j"${jobs}" >"${deps}/abseil-build.log" ||
    die "abseil build failed, see ${deps}/abseil-build.log"
  cmake --install "${deps}/abseil-build" >/dev/null
  # Only the installed headers and libraries are needed from here on (about 36 MB).
  rm -rf "${deps}/abseil-build" "${src}"
  touch "${stamp}"
fi

# --- 3. the instrumented scheduler and tests --------------------------------------------------
cmake -S "${root}/scripts/tsan" -B "${build}" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DABSL_PREFIX="${absl_prefix}" >/dev/null
ninja -C "${build}" -j"${jobs}" scheduler_tsan_test scheduler_overhead_tsan task_pool_tsan_test

# --- 4. runs ----------------------------------------------------------------------------------
logs="${build}/tsan-reports"
rm -rf "${logs}"
mkdir -p "${logs}"
# print_suppressions: each log ends with the suppressions that matched and how often.
options="halt_on_error=0 second_deadlock_stack=1 print_suppressions=1 exitcode=66"
options+=" suppressions=${root}/scripts/tsan/suppressions.txt"

failed=0
run() {  # NAME COMMAND...: runs one program, TSan's reports going to ${logs}/NAME.PID
  local name="$1"
  shift
  say "run ${name}: ${*#"${build}/"}"
  local status=0
  # A hang (a lost wake-up, a Stop() that never returns) fails the run instead of stalling it.
  TSAN_OPTIONS="${options} log_path=${logs}/${name}" timeout 900 "$@" >"${build}/${name}.out" \
    2>&1 || status=$?
  grep -E "^\[  (PASSED|FAILED) " "${build}/${name}.out" | sort | uniq -c | sed -e "s/^/  /" || true
  if ((status == 124)); then
    say "${name} did not finish within 900 s (a hang?); output in ${build}/${name}.out"
    failed=1
  elif ((status != 0)); then
    say "${name} exited with ${status}; output in ${build}/${name}.out"
    failed=1
  fi
}

start=${SECONDS}
# Every scheduler test, repeated in shuffled order.
run unit "${build}/scheduler_tsan_test" --gtest_repeat="${repeat}" --gtest_shuffle \
  --gtest_brief=1
# The concurrent ones (several submitting threads, several workers and completion threads) once
# more, many times over.
run load "${build}/scheduler_tsan_test" \
  --gtest_filter='SchedulerLoadTest.*:SchedulerWorkersTest.*:SchedulerFairnessTest.*' \
  --gtest_repeat=$((repeat * 5)) --gtest_brief=1
# The overhead driver: 8 producers over 2 workers with enclave threads answering, then a
# one-at-a-time latency loop.
run overhead "${build}/scheduler_overhead_tsan" --requests 20000 --producers 8 --tenants 4 \
  --workers 2
# The enclave's thread pool (PCIe ciphers, batch runs), jobs from several callers at once.
run task_pool "${build}/task_pool_tsan_test" --gtest_repeat="${repeat}" --gtest_shuffle \
  --gtest_brief=1

reports=0
if compgen -G "${logs}/*" >/dev/null; then
  reports=$(cat "${logs}"/* | grep -c "^WARNING: ThreadSanitizer" || true)
  suppressed=$(cat "${logs}"/* | awk '/^ *[0-9]+ race:/ { n += $1 } END { print n + 0 }')
  say "suppressed (scripts/tsan/suppressions.txt): ${suppressed}"
fi
say "runs took $((SECONDS - start)) s; ThreadSanitizer reports: ${reports} (logs in ${logs})"
if ((reports > 0)); then
  grep -h -A3 "^WARNING: ThreadSanitizer" "${logs}"/* | head -n 40
  failed=1
fi
if ((failed)); then
  say "FAILED"
  exit 1
fi
say "passed: no ThreadSanitizer reports"
