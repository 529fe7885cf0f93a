#!/usr/bin/env bash
# Checks that every tracked C++/CUDA source is formatted by the repo's .clang-format
# (clang-format 14, as in CI and scripts/setup.sh). Prints each drifting file and fails.
#   scripts/check_format.sh          check (CI: .ci/run)
#   scripts/check_format.sh --fix    format the drifting files in place
set -euo pipefail
cd "$(dirname "$0")/.."
fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  *) echo "usage: scripts/check_format.sh [--fix]" >&2; exit 2 ;;
esac
format=""
for candidate in clang-format-14 clang-format; do
  if command -v "$candidate" >/dev/null 2>&1; then format="$candidate"; break; fi
done
if [ -z "$format" ]; then
  echo "check_format: clang-format 14 not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
if ! "$format" --version | grep -q "version 14\."; then
  echo "check_format: $("$format" --version) is not clang-format 14; its output differs" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cu' '*.cuh' '*.h' '*.cc')
# One run over every file; its warnings name the drifting ones ("path:line:col: error: ...").
mapfile -t drifting < <("$format" --dry-run --Werror "${files[@]}" 2>&1 |
  grep -oE '^[^: ]+\.(cpp|hpp|cu|cuh|h|cc):[0-9]+:[0-9]+: (error|warning)' | cut -d: -f1 | sort -u)
if [ "${#drifting[@]}" -eq 0 ]; then
  echo "check_format: ${#files[@]} files formatted"
  exit 0
fi
if [ "$fix" -eq 1 ]; then
  "$format" -i "${drifting[@]}"
  printf 'check_format: formatted %s\n' "${drifting[@]}"
  exit 0
fi
printf 'check_format: not formatted (scripts/check_format.sh --fix): %s\n' "${drifting[@]}" >&2
exit 1
