# scripts/lib/quality_data.sh — what the scripts/quality_*.sh comparisons share, sourced from the
# repository root: their options and the planted data they compare on.
#
# quality_options "$@"   sets bin (--bin, default build/bin), data (--data, default
#                        output/synthetic) and epochs (--epochs, default 1); exits 2 on anything else
# quality_planted_data   writes DATA/train (1,000,000 lines, 8 files) and DATA/test (100,000
#                        held-out lines of the same planted model: zipf 2, one factor) unless
#                        DATA/test/oracle.json is there already

quality_options() {
  bin=build/bin
  data=output/synthetic
  epochs=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --bin|--data|--epochs)
        [ $# -ge 2 ] || { echo "$1 needs a value" >&2; exit 2; }
        case "$1" in --bin) bin="$2" ;; --data) data="$2" ;; --epochs) epochs="$2" ;; esac
        shift 2 ;;
      *) echo "unknown option $1" >&2; exit 2 ;;
    esac
  done
}

quality_planted_data() {
  if [ ! -f "$data/test/oracle.json" ]; then
    "$bin/gpubox_data" gen --out "$data/train" --lines 1000000 --files 8 --seed 7 --zipf 2.0 --factor-dim 1
    "$bin/gpubox_data" gen --out "$data/test" --lines 100000 --files 1 --seed 7 --zipf 2.0 --factor-dim 1 \
      --first_line 1000000
  fi
}
