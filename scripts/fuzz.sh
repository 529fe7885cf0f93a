#!/usr/bin/env bash
# scripts/fuzz.sh [--seconds N] [target...]
#   Builds the libFuzzer targets (clang, ASan + UBSan) in build-fuzz/ and runs each for N seconds
#   (default 60) from its seed corpus in tests/fuzz/corpus/<target>/. New inputs the fuzzer finds
#   go to build-fuzz/corpus/<target>/ (never into the repo); a crash or violated property is saved
#   under build-fuzz/artifacts/<target>/ and fails the script. Prints one line per target: runs,
#   coverage, CPU seconds. Targets: fuzz_protocol fuzz_slot_parser fuzz_multislot_parser
#   fuzz_criteo_parser fuzz_config fuzz_request_parser (default: all). --build-only builds the
#   targets and runs none (CI builds them beside the tests, then runs them).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
build_only=0
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#--seconds=}"; shift ;;
    --build-only) build_only=1; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    fuzz_*) targets+=("$1"); shift ;;
    *) echo "fuzz.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if ((${#targets[@]} == 0)); then
  targets=(fuzz_protocol fuzz_slot_parser fuzz_multislot_parser fuzz_criteo_parser fuzz_config
    fuzz_request_parser)
fi

scripts/setup.sh --fuzz
build_dir="${GPUBOX_FUZZ_BUILD_DIR:-build-fuzz}"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  launcher=()
  if command -v ccache >/dev/null 2>&1; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
  generator=()
  if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
  CC=clang-14 CXX=clang++-14 cmake -S . -B "$build_dir" "${generator[@]}" -DGPUBOX_BACKEND=cpu \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUBOX_BUILD_FUZZERS=ON -DGPUBOX_BUILD_TESTS=OFF \
    -DGPUBOX_BUILD_BENCHMARKS=OFF -DGPUBOX_PYTHON=OFF "${launcher[@]}" >/dev/null
fi
cmake --build "$build_dir" -j "${GPUBOX_JOBS:-$(nproc)}" --target "${targets[@]}" >/dev/null
if ((build_only)); then exit 0; fi

failed=0
for t in "${targets[@]}"; do
  seeds="tests/fuzz/corpus/$t"
  work="$build_dir/corpus/$t"
  artifacts="$build_dir/artifacts/$t"
  mkdir -p "$work" "$artifacts"
  log="$build_dir/$t.log"
  start_cpu=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
  status=0
  ( time "$build_dir/bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -artifact_prefix="$artifacts/" -print_final_stats=1 "$work" "$seeds" ) \
      >"$log" 2>&1 || status=$?
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || echo "?")
  cpu=$(awk '/^user|^sys/ {split($2, t, "m"); s += t[1] * 60 + t[2]} END {printf "%.0f", s}' "$log")
  if [ "$status" -ne 0 ]; then
    failed=1
    echo "fuzz: $t FAILED (exit $status) after $runs runs; see $log and $artifacts/"
    grep -E "ERROR|violated|SUMMARY" "$log" | head -5 || true
  else
    echo "fuzz: $t ok: $runs runs, cov $cov, ${cpu} CPU s, corpus $(ls "$work" | wc -l) files"
  fi
done
exit "$failed"
