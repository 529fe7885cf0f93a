# shellcheck shell=bash disable=SC2034  # (sets config_flag_* for its caller)
# The config and the -o overrides among gpubox_train's arguments, in every spelling gpubox_train
# takes: gflags' -flag and --flag with the value after '=' or as the next argument, PaddleRec's
# -m and --config_yaml, and -okey=value. The servers run_gpubox.sh and launch.sh start must read
# the config and overrides their trainers read: a spelling only the trainers understood left the
# servers on their defaults (their shards, save form and memory limit), exit 0.
#
# config_flag ARG [NEXT]: sets config_flag_kind (config, override or empty: neither),
# config_flag_value and config_flag_used (the arguments it takes: 1 or 2).
config_flag() {
  config_flag_kind=""
  config_flag_value=""
  config_flag_used=1
  case "$1" in
    --config | -config | -m | --config_yaml | -config_yaml)
      config_flag_kind=config; config_flag_value="${2-}"; config_flag_used=2 ;;
    --config=* | -config=* | --config_yaml=* | -config_yaml=*)
      config_flag_kind=config; config_flag_value="${1#*=}" ;;
    -o | --o)
      config_flag_kind=override; config_flag_value="${2-}"; config_flag_used=2 ;;
    -o=* | --o=*)
      config_flag_kind=override; config_flag_value="${1#*=}" ;;
    -out=*) ;;  # gpubox_train's --out (export), spelt with one dash
    -o?*=*)  # -okey=value (a config key holds a '.')
      config_flag_kind=override; config_flag_value="${1#-o}" ;;
  esac
}
