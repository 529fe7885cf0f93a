#!/bin/bash
# bash tests/scripts/config_args_test.sh REPO
# scripts/lib/config_args.sh's config_flag against every spelling gpubox_train takes for its
# config and overrides (gflags' one or two dashes, '=' or the next argument, PaddleRec's -m and
# --config_yaml, -okey=value), and the arguments it must leave to the trainers (--out, -out=DIR,
# other flags): run_gpubox.sh and launch.sh hand the servers what it finds.
set -eu
repo="$1"
# shellcheck source=scripts/lib/config_args.sh
source "$repo/scripts/lib/config_args.sh"
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() {  # expect KIND VALUE USED ARG [NEXT]
  local kind="$1" value="$2" used="$3"
  shift 3
  config_flag "$@"
  if [ "$config_flag_kind" != "$kind" ] || [ "$config_flag_value" != "$value" ] ||
    [ "$config_flag_used" != "$used" ]; then
    fail "'$*': got kind '$config_flag_kind' value '$config_flag_value' used $config_flag_used," \
      "expected '$kind' '$value' $used"
  fi
}
for flag in --config -config -m --config_yaml -config_yaml; do
  expect config c.yaml 2 "$flag" c.yaml
done
for flag in --config -config --config_yaml -config_yaml; do
  expect config a=b.yaml 1 "$flag=a=b.yaml" next
done
for flag in -o --o; do
  expect override runner.epochs=2 2 "$flag" runner.epochs=2
  expect override runner.epochs=2 1 "$flag=runner.epochs=2" next
done
expect override runner.epochs=2 1 -orunner.epochs=2 next
expect override "hyper_parameters.fc_sizes=[8, 4]" 1 "-ohyper_parameters.fc_sizes=[8, 4]"
for other in --out -out -out=dir --mode=infer --load x -m=c.yaml -h; do
  expect "" "" 1 "$other" next
done
echo "config_args_test: ok"
