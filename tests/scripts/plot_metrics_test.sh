#!/bin/sh
# sh tests/scripts/plot_metrics_test.sh REPO
# scripts/plot_metrics.sh on tests/scripts/data/metrics.jsonl (a real run's metrics, pass and
# test lines): a PNG comes out, and the numbers it draws are the file's (checked against
# Python's json module). Exit 77 (skipped) when gnuplot is not installed.
set -eu
repo="$1"
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "SKIP: gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)"
  exit 77
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/gpubox_plot_test_XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
metrics="$repo/tests/scripts/data/metrics.jsonl"

sh "$repo/scripts/plot_metrics.sh" "$metrics" --out "$work/plots" >"$work/out.txt" 2>&1 \
  || { cat "$work/out.txt"; fail "plot_metrics.sh exited nonzero"; }
grep -q "wrote $work/plots/metrics.png" "$work/out.txt" || { cat "$work/out.txt"; fail "no 'wrote' line"; }
[ -s "$work/plots/metrics.png" ] || fail "no metrics.png"
# The PNG signature, and more than an empty canvas.
[ "$(head -c 4 "$work/plots/metrics.png" | od -An -c | tr -d ' \n')" = "211PNG" ] || fail "not a PNG"
[ "$(wc -c <"$work/plots/metrics.png")" -gt 10000 ] || fail "PNG too small to hold three plots"

# The drawn numbers against the JSON read by another parser.
python3 - "$metrics" "$work/plots/metrics_passes.dat" "$work/plots/metrics_tests.dat" <<'PY' || fail "drawn numbers differ from the file"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
passes = [l for l in lines if "pass" in l]
tests = [l for l in lines if "test_auc" in l]
rows = [r.split() for r in open(sys.argv[2]) if not r.startswith("#")]
trows = [r.split() for r in open(sys.argv[3]) if not r.startswith("#")]
assert len(passes) >= 2 and len(rows) == len(passes), (len(rows), len(passes))
assert len(tests) >= 1 and len(trows) == len(tests), (len(trows), len(tests))
def same(text, value):
    return (value is None and text == "NaN") or (value is not None and math.isclose(float(text), value, rel_tol=1e-9))
for i, (r, p) in enumerate(zip(rows, passes)):
    assert int(r[0]) == i, r
    for col, name in [(1, "pass"), (2, "auc"), (3, "logloss"), (4, "ips"), (5, "ips_per_card")]:
        assert same(r[col], p[name]), (i, name, r[col], p[name])
# A test line sits at the last pass before it.
last = 0
t = 0
for l in lines:
    if "pass" in l: last += 1
    if "test_auc" in l:
        assert int(trows[t][0]) == last - 1 and same(trows[t][2], l["test_auc"]), (trows[t], l)
        t += 1
PY

# No pass line: an error saying so, no PNG.
printf '{"epoch": 0, "test_auc": 0.5}\n' >"$work/no_pass.jsonl"
if sh "$repo/scripts/plot_metrics.sh" "$work/no_pass.jsonl" --out "$work/none" >"$work/out2.txt" 2>&1; then
  fail "a file without pass lines was plotted"
fi
grep -q "holds no pass line" "$work/out2.txt" || { cat "$work/out2.txt"; fail "no reason given"; }
[ ! -e "$work/none/metrics.png" ] || fail "a PNG was written for no data"
echo "PASS"
