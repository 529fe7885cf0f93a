#!/bin/bash
# bash tests/scripts/readme_tour_test.sh REPO BUILD_DIR
# README.md's tour (train -> infer -> export -> serve -> plot), run as written, line by line, in
# a scratch folder laid out like the repository (scripts/ and the build linked, configs/ copied,
# so its output/ and log/ land there): every command exits 0, the saves and the metrics file
# appear, infer evaluates every save, the export is served and answers one prediction per line
# of the sample. Two edits only: the port is a free one, and the `sleep 1` after starting
# gpubox_serve becomes a wait for /health (a loaded test machine may need longer). The plot line
# runs only where gnuplot is installed. Exit 77 (skipped) without curl.
set -eu
repo="$1"
build="$2"
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl is not installed"; exit 77; }
work="$(mktemp -d "${TMPDIR:-/tmp}/gpubox_tour_test_XXXXXX")"
serve_pid=""
cleanup() {
  if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The tour: the first ```sh block after the "## A tour" heading.
tour="$(awk '/^## A tour/ {t = 1} t && /^```sh$/ {b = 1; next} b && /^```$/ {exit} b {print}' \
  "$repo/README.md")"
[ -n "$tour" ] || fail "README.md has no '## A tour' heading followed by a sh block"
port="$(python3 "$repo/tests/scripts/free_port.py")"  # below the ephemeral range

mkdir -p "$work/repo"
ln -s "$repo/scripts" "$work/repo/scripts"
ln -s "$build" "$work/repo/build"
cp -r "$repo/configs" "$work/repo/configs"
cd "$work/repo"

# Continuation lines joined, comments dropped: one command per entry.
joined="$(printf '%s\n' "$tour" | sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | sed -e 's/[[:space:]]#.*$//')"
n=0
while IFS= read -r cmd; do
  [ -n "${cmd// /}" ] || continue
  n=$((n + 1))
  cmd="${cmd//29080/$port}"
  case "$cmd" in
    *gpubox_serve*'&'*)
      eval "exec ${cmd%%&*}" >"$work/serve.log" 2>&1 &
      serve_pid=$!
      for _ in $(seq 1 100); do
        curl -sf "localhost:$port/health" >/dev/null 2>&1 && break
        kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log"; fail "gpubox_serve exited"; }
        sleep 0.2
      done
      ;;
    "kill %1")
      kill "$serve_pid"
      wait "$serve_pid" || { cat "$work/serve.log"; fail "gpubox_serve did not stop with 0"; }
      serve_pid=""
      ;;
    scripts/plot_metrics.sh*)
      if command -v gnuplot >/dev/null 2>&1; then
        eval "$cmd" >"$work/step$n.log" 2>&1 || { cat "$work/step$n.log"; fail "step $n: $cmd"; }
        [ -s log/plots/metrics.png ] || fail "no log/plots/metrics.png"
      fi
      ;;
    *)
      eval "$cmd" >"$work/step$n.log" 2>&1 || { tail -20 "$work/step$n.log"; fail "step $n: $cmd"; }
      ;;
  esac
done <<EOF
$joined
EOF
[ "$n" -ge 6 ] || fail "the tour has $n commands; expected train, infer, export, serve, curl, kill, plot"

# What the tour says it does, checked on what it left.
for p in 0 1 2; do
  [ -f "output/model_dnn/$p/MODEL_MANIFEST" ] || fail "no save output/model_dnn/$p"
done
[ "$(grep -c '"pass"' log/metrics.jsonl)" -eq 3 ] || fail "log/metrics.jsonl does not hold 3 passes"
infer_log="$(grep -l 'infer: save:' "$work"/step*.log)" || fail "no infer lines"
[ "$(grep -c 'infer: save: output/model_dnn/' "$infer_log")" -eq 3 ] || fail "infer did not evaluate 3 saves"
[ -f output/serving/model_dnn/MANIFEST ] || fail "no export in output/serving/model_dnn"
curl_log="$(grep -l '"predictions"' "$work"/step*.log)" || fail "no predictions answered"
lines="$(grep -c . configs/data/sample_data/train/sample_train.txt)"
python3 - "$curl_log" "$lines" <<'PY' || fail "the predictions are not one probability per sample line"
import json, sys
p = json.load(open(sys.argv[1]))["predictions"]
assert len(p) == int(sys.argv[2]) and all(0.0 < x < 1.0 for x in p), (len(p), sys.argv[2])
PY
echo "PASS: README tour, $n commands"
