#!/usr/bin/env bash
# Coverage-guided fuzzing of onnax (docs/untrusted.md, "Fuzzing"): builds the libFuzzer target
# (clang, ASan + UBSan) into build-fuzz/, never into the regular build/, and runs it.
#
#   scripts/fuzz.sh [--seconds N] [--jobs J] [--keep-going]
#                                             fuzz for N seconds (default 600) with J processes;
#                                             --keep-going (implied by J > 1; libFuzzer's fork
#                                             mode, which re-runs part of the corpus in every job:
#                                             slower) goes on after a finding
#   scripts/fuzz.sh --replay                  run every input in fuzz/regressions/ once (a test)
#   scripts/fuzz.sh --ci [--seconds N]        the CI run: a cheaper build (build-fuzz/ci: -O0,
#                                             build/'s uninstrumented protobuf and ONNX), --replay,
#                                             then N seconds (default 60; 0: none) from the
#                                             committed corpus
#   scripts/fuzz.sh --merge                   add to the committed corpus (fuzz/corpus.tar.xz) the
#                                             fewest inputs of build-fuzz/corpus (up to 4 KB each)
#                                             that reach something it does not
#   scripts/fuzz.sh --build                   only build
# Arguments after `--` go to libFuzzer (e.g. -- -seed=1). Crash, timeout and out-of-memory
# inputs are written to fuzz/regressions/, which is committed: minimize one
# (build-fuzz/onnax_fuzz -minimize_crash=1 -runs=10000 FILE), rename it after its cause, and it
# is replayed from then on. The working corpus grows in build-fuzz/corpus; the seeds
# (fuzz/make_corpus.py, written to build-fuzz/seeds) are merged into it on the first run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-fuzz"
regressions="$root/fuzz/regressions"
# A compact corpus (the small inputs that together reach what the long runs reached), so the
# CI run starts where they left off: one compressed file rather than a thousand.
committed_corpus="$root/fuzz/corpus.tar.xz"
mode=fuzz seconds="" jobs=1 keep_going=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --keep-going) keep_going=1; shift ;;
    --replay) mode=replay; shift ;;
    --ci) mode=ci; shift ;;
    --merge) mode=merge; shift ;;
    --build) mode=build; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

cmake_args=()
if [ "$mode" = ci ]; then
  # Compiling onnax with -O3 and sanitizers takes about 15 CPU minutes and building an
  # instrumented ONNX 4 more; this build takes a quarter of that (see docs/untrusted.md).
  build="$root/build-fuzz/ci"
  [ -f "$root/build/third_party/onnx/lib/libonnx.a" ] || {
    echo "fuzz.sh --ci links the regular build's protobuf and ONNX. Fix: ./build.sh first" >&2
    exit 2
  }
  cmake_args=(-DONNAX_FUZZ_THIRD_PARTY_DIR="$root/build/third_party" -DONNAX_FUZZ_CODEGEN_FLAGS=-O0)
fi
fuzzer="$build/onnax_fuzz"

# Caps for every input: 2 GB (for one allocation too: libFuzzer's malloc limit defaults to the
# RSS limit) and 30 s. A transform that needs more is a finding (a memory bomb or a hang).
caps=(-rss_limit_mb=2048 -timeout=30)
# libFuzzer's entropic schedule spent half of every run updating its feature frequencies (a
# transform touches tens of thousands of features); without it the target runs 2-4x faster.
schedule=(-entropic=0)
# Short allocation stacks: the fuzzed code allocates a lot, and recording 30 frames per
# allocation (the default) costs a fifth of the run time.
export ASAN_OPTIONS="${ASAN_OPTIONS:-malloc_context_size=10}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

build_fuzzer() {
  command -v clang++ >/dev/null || {
    echo "fuzz.sh: clang++ not found. Fix: scripts/install_deps.sh (installs clang and libclang-rt-dev)" >&2
    exit 2
  }
  local cmake="$root/.venv/bin/cmake"
  [ -x "$cmake" ] || cmake=cmake
  if [ ! -f "$build/build.ninja" ]; then
    "$cmake" -S "$root" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DONNAX_FUZZ=ON \
      -DONNAX_BUILD_PYTHON=OFF -DONNAX_BUILD_TESTS=OFF -DONNAX_DOWNLOAD_DIR="$root/.deps/downloads" \
      -DPython3_EXECUTABLE="$root/.venv/bin/python" "${cmake_args[@]}" >/dev/null
  fi
  nice -n 10 "$cmake" --build "$build" --target onnax_fuzz -j "$(nproc)"
}

# Each regression input once; every failure is reported, and any fails the replay.
replay() {
  local failed=0 count=0 f
  shopt -s nullglob
  for f in "$regressions"/*; do
    case "$(basename "$f")" in *.md) continue ;; esac
    count=$((count + 1))
    if ! TMPDIR="$build/tmp" "$fuzzer" "${caps[@]}" -runs=1 "$f" >"$build/replay.log" 2>&1; then
      echo "fuzz.sh: REGRESSION $f" >&2
      grep -E "ERROR|onnax_fuzz:|SUMMARY|runtime error|#[0-9]+ 0x" "$build/replay.log" | head -20 >&2
      failed=$((failed + 1))
    fi
  done
  echo "fuzz.sh: replayed $count regression inputs, $failed failed"
  [ "$failed" -eq 0 ]
}

seeds() {
  if [ ! -d "$build/seeds" ]; then
    rm -rf "$build/seeds.tmp"
    "$root/.venv/bin/python" "$root/fuzz/make_corpus.py" --out "$build/seeds.tmp" --dict "$build/onnx.dict" "$@"
    mv "$build/seeds.tmp" "$build/seeds"
  fi
}

# Fuzzes for $1 seconds from the given corpus folders ($build/corpus collects new inputs).
fuzz() {
  local secs="$1"
  shift
  mkdir -p "$build/corpus" "$regressions"
  local dict=() parallel=()
  [ -f "$build/onnx.dict" ] && dict=(-dict="$build/onnx.dict")
  # Fork mode goes on after a finding (each is still written to fuzz/regressions/).
  if [ "$jobs" -gt 1 ] || [ "$keep_going" = 1 ]; then
    parallel=(-fork="$jobs" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
  fi
  TMPDIR="$build/tmp" nice -n 10 "$fuzzer" "${caps[@]}" "${schedule[@]}" "${dict[@]}" "${parallel[@]}" \
    -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$regressions/" \
    "${extra[@]}" "$build/corpus" "$@"
}

# The committed corpus, unpacked afresh into $build/committed (absent: nothing).
unpack_committed() {
  rm -rf "$build/committed"
  mkdir -p "$build/committed"
  [ -f "$committed_corpus" ] && tar -xJf "$committed_corpus" -C "$build/committed"
  return 0
}

mkdir -p "$build/tmp"  # the target's scratch folders (load_model/save_model) stay in here
case "$mode" in
  build) build_fuzzer ;;
  replay) build_fuzzer; replay ;;
  ci)
    build_fuzzer
    replay
    # The committed corpus is the starting point; without one, the repository's own models.
    unpack_committed
    corpus=("$build/committed")
    if [ ! -f "$committed_corpus" ]; then seeds --no-node-tests; corpus=("$build/seeds"); fi
    # A fixed seed, so a CI run's mutations can be replayed (-- -seed=N overrides it).
    [ ${#extra[@]} -eq 0 ] && extra=(-seed=1)
    if [ "${seconds:-60}" -gt 0 ]; then fuzz "${seconds:-60}" "${corpus[@]}"; fi
    ;;
  merge)
    build_fuzzer
    unpack_committed
    rm -rf "$build/small" && mkdir -p "$build/small"
    find "$build/corpus" -type f -size -4097c -exec cp {} "$build/small/" \;
    # Keeps the committed inputs and adds the fewest small ones that reach more.
    TMPDIR="$build/tmp" nice -n 10 "$fuzzer" "${caps[@]}" -merge=1 "$build/committed" "$build/small"
    # Reproducible: sorted names, no owners or times.
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$build/committed" -cf - . |
      xz -9 >"$committed_corpus"
    echo "fuzz.sh: $(find "$build/committed" -type f | wc -l) inputs in $committed_corpus" \
      "($(du -k "$committed_corpus" | cut -f1) KB)"
    ;;
  fuzz)
    build_fuzzer
    unpack_committed
    # The seeds once, merged into the working corpus (the few that reach something new), so a
    # run does not execute all ~8,000 of them again before it starts fuzzing.
    if [ ! -f "$build/seeds.merged" ]; then
      seeds
      mkdir -p "$build/corpus"
      echo "fuzz.sh: merging the seeds into build-fuzz/corpus (once; several minutes)"
      TMPDIR="$build/tmp" nice -n 10 "$fuzzer" "${caps[@]}" -merge=1 "$build/corpus" "$build/seeds" \
        "$build/committed"
      touch "$build/seeds.merged"
    fi
    fuzz "${seconds:-600}" "$build/committed"
    ;;
esac
