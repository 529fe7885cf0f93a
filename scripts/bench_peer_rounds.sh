#!/usr/bin/env bash
# scripts/bench_peer_rounds.sh --models LIST [--rounds N] [--out DIR] [bench_peer_paddle.sh args]
#   scripts/bench_peer_paddle.sh (single mode) for each PaddleRec network of LIST (comma-separated,
#   e.g. dcn,dlrm), round after round (dcn, dlrm, dcn, dlrm, ...), each run into
#   DIR/r<round>-<model>/, then scripts/peer_rounds.py over them: per network and precision each
#   round's ratio to Paddle and their median, printed and written to DIR/rounds.md and
#   DIR/rounds.json. A shared VM can slow one run by half (BENCHMARKS.md, "dcn and dlrm in fp32
#   against Paddle on a Zen 4 VM"): rounds interleave the networks so that a slow phase falls on
#   one round, and the median of rounds is the figure to quote. --rounds defaults to 3, --out to
#   output/peer-rounds. Every other argument goes to each bench_peer_paddle.sh run as given
#   (--paddlerec DIR is needed; --model, --out, --data and --mode are this script's to set).
#   Not part of tests or CI (it needs Paddle); scripts/peer_rounds.py is tested on its own.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
die() { echo "bench_peer_rounds: $*" >&2; exit 2; }
models="" rounds=3 out="$repo/output/peer-rounds"
pass=()
while (($#)); do
  case "$1" in
    --models) [ $# -ge 2 ] || die "--models needs a value"; models="$2"; shift 2 ;;
    --rounds) [ $# -ge 2 ] || die "--rounds needs a value"; rounds="$2"; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a value"; out="$2"; shift 2 ;;
    --model|--data|--mode|--keep-data) die "$1 is set by this script (use --models, --out)" ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) pass+=("$1"); shift ;;
  esac
done
[ -n "$models" ] || die "--models LIST is required (e.g. --models dcn,dlrm)"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer, got '$rounds'"
IFS=, read -r -a model_list <<<"$models"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
for ((r = 1; r <= rounds; ++r)); do
  for m in "${model_list[@]}"; do
    run="$out/r$r-$m"
    rm -rf "$run"
    echo "bench_peer_rounds: round $r of $rounds, $m (load $(cut -d' ' -f1-3 /proc/loadavg); log: $run.log)"
    "$repo/scripts/bench_peer_paddle.sh" --model "$m" --out "$run" ${pass[@]+"${pass[@]}"} >"$run.log" 2>&1 ||
      die "round $r, $m failed (exit $?): $(tail -3 "$run.log")"
  done
done
python3 "$repo/scripts/peer_rounds.py" "$out" --md "$out/rounds.md" --json "$out/rounds.json"
