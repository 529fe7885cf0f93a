# shellcheck shell=bash
# scripts/gpu_check/tests.sh: item 3, the unit tests (every bin/*_test or --tests).
# Sourced by scripts/gpu_check.sh (after its options are read), in its order; uses and sets its
# variables. Needs bash.

# ---- 3. unit tests -------------------------------------------------------------------------------
declare -A skip_reason=()
if ((run_tests)); then
  echo
  echo "================ 3. unit tests (bin/*_test, GPUBOX_DEVICE_CHECK=1)"
  # Tests that open compiled-in absolute paths of the build machine (test_paths.txt).
  if ((!custom_bin)) && [ -f "$root/test_paths.txt" ]; then
    src="$(awk -F'\t' '$1 == "source_dir" { print $2 }' "$root/test_paths.txt")"
    if [ -n "$src" ] && [ ! -e "$src" ] && [ ! -L "$src" ] && ((link)); then
      parent="$(dirname "$src")"
      missing_parents=()
      p="$parent"
      while [ ! -d "$p" ]; do missing_parents=("$p" "${missing_parents[@]}"); p="$(dirname "$p")"; done
      if mkdir -p "$parent" 2>/dev/null && ln -s "$root" "$src" 2>/dev/null; then
        made_dirs=("${missing_parents[@]}")
        made_link="$src"
        note "linked $src -> $root for the tests' compiled-in paths (removed on exit)"
      else
        note "cannot create $src (permissions?): the tests that need it are skipped"
      fi
    fi
    while IFS=$'\t' read -r macro path test; do
      case "$macro" in '#'*|source_dir|'') continue ;; esac
      probe="$path"
      [ "$macro" = GPUBOX_SOURCE_DIR ] && probe="$path/configs/config_gpubox.yaml"
      if [ ! -e "$probe" ]; then skip_reason["$test"]="needs $probe ($macro, compiled in)"; fi
    done < "$root/test_paths.txt"
  fi
  mkdir -p "$out/tests"
  printf '%-28s %-8s %8s  %s\n' test result seconds detail
  n_pass=0 n_fail=0 n_skip=0 skipped_cases=0
  test_bins=("$bin"/*_test)
  if [ -n "$only_tests" ]; then
    IFS=, read -r -a test_bins <<<"$only_tests"
    test_bins=("${test_bins[@]/#/$bin/}")
  fi
  for t in "${test_bins[@]}"; do
    if [ ! -x "$t" ]; then
      [ -z "$only_tests" ] || record FAIL "test $(basename "$t")" "--tests names $t, which is not an executable"
      continue
    fi
    name="$(basename "$t")"
    if [ -n "${skip_reason[$name]:-}" ]; then
      printf '%-28s %-8s %8s  %s\n' "$name" SKIPPED - "${skip_reason[$name]}"
      n_skip=$((n_skip + 1)); continue
    fi
    work="$out/tests/$name.work"
    mkdir -p "$work"
    start=$(date +%s.%N)
    rc=0
    GPUBOX_DEVICE_CHECK=1 RUN_CWD="$work" TMPDIR="$work" run_limited "$test_timeout" "$out/tests/$name.log" "$t" --gtest_color=no || rc=$?
    secs="$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
    rm -rf "$work"
    summary_line="$(grep -E '^\[  PASSED  \]|^\[  SKIPPED \] [0-9]+ test|^\[  FAILED  \] [0-9]+ test' "$out/tests/$name.log" | tr '\n' ' ' || true)"
    skipped_here="$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out/tests/$name.log" | head -n 1)"
    skipped_cases=$((skipped_cases + ${skipped_here:-0}))
    if ((rc == 0)); then
      printf '%-28s %-8s %8s  %s\n' "$name" ok "$secs" "$summary_line"
      n_pass=$((n_pass + 1))
    else
      why="$(why_failed "$rc" "$test_timeout")"
      printf '%-28s %-8s %8s  %s %s\n' "$name" FAILED "$secs" "$why;" "$summary_line"
      # The first failure message and up to 5 failing test names (all of it is in the log).
      grep -m1 -A1 ': Failure$' "$out/tests/$name.log" | sed 's/^/      | /' || true
      awk '/listed below:/ { f = 1; next } f && /^\[  FAILED  \]/ { n++; if (n <= 5) print "      " $0 }
           END { if (n > 5) printf "      ... and %d more\n", n - 5 }' "$out/tests/$name.log"
      grep -q ': Failure$' "$out/tests/$name.log" || tail -n 5 "$out/tests/$name.log" | sed 's/^/      | /'
      n_fail=$((n_fail + 1))
      record FAIL "test $name" "$why (tests/$name.log)"
    fi
  done
  # Why test cases skipped (card counts the machine lacks, in-process-only cases).
  grep -h -A1 '^\[  SKIPPED \] [A-Za-z]' "$out"/tests/*.log 2>/dev/null | grep -o 'needs [0-9]* GPUs, this machine has [0-9]*\|in-process communicator only' |
    sort | uniq -c | sed 's/^ */  skipped: /' || true
  echo "tests: $n_pass binaries passed, $n_fail failed, $n_skip not run; $skipped_cases test cases skipped (logs: $out/tests/)"
  ((n_fail > 0)) || record PASS "unit tests" "$n_pass binaries passed, $n_skip not run, $skipped_cases cases skipped (see tests/*.log)"
else
  record SKIP "unit tests" "--skip-tests"
fi
