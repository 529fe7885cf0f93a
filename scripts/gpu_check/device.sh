# shellcheck shell=bash
# scripts/gpu_check/device.sh: items 1 and 2: the device query (nvidia-smi), the shared libraries of bin/
# and the peer-access matrix GPUBox grants; the card counts the machine has.
# Sourced by scripts/gpu_check.sh (after its options are read), in its order; uses and sets its
# variables. Needs bash.

echo "================ GPUBox GPU check  $(date -u +%Y-%m-%dT%H:%M:%SZ)"
if [ -f "$root/MANIFEST.txt" ]; then sed -n '1,5p' "$root/MANIFEST.txt"; fi
echo "host: $(hostname), $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //'), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) memory"
echo "binaries: $bin"
echo "output: $out"

# ---- 1. GPUs -------------------------------------------------------------------------------------
echo
echo "================ 1. device query"
mkdir -p "$out/device"
ngpu=0
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi | tee "$out/device/nvidia-smi.txt" || die "nvidia-smi failed: is the NVIDIA driver loaded?"
  nvidia-smi -q > "$out/device/nvidia-smi-q.txt" 2>&1 || true
  query="$(nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null ||
           nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader)"
  echo "index, name, compute capability, memory, driver"
  echo "$query" | tee "$out/device/gpus.csv"
  ngpu="$(grep -c . <<<"$query" || true)"
  ((ngpu > 0)) || die "nvidia-smi lists no GPU"
  echo "topology (nvidia-smi topo -m):"
  nvidia-smi topo -m 2>&1 | tee "$out/device/topo.txt" || true
  # The bundle's kernels are built for the archs in MANIFEST.txt (sm_XX + PTX of the newest):
  # a GPU of a lower compute capability cannot run them.
  archs="$(sed -n 's/^cuda archs: *\([0-9;]*\).*/\1/p' "$root/MANIFEST.txt" 2>/dev/null || true)"
  if [ -n "$archs" ] && ((!custom_bin)); then
    min_arch="$(tr ';' '\n' <<<"$archs" | sed 's/[^0-9].*//' | sort -n | head -n 1)"
    while IFS=, read -r idx name cc _; do
      cc="$(tr -d ' .' <<<"$cc")"
      if [[ "$cc" =~ ^[0-9]+$ ]] && ((cc < min_arch)); then
        echo "gpu_check: warning: GPU $idx ($name) has compute capability $cc < $min_arch, the lowest arch" \
             "built into this bundle ($archs): rebuild with scripts/bundle_cuda.sh --archs \"$cc;$archs\"" >&2
      fi
    done <<<"$query"
  fi
  record PASS "device query" "$ngpu GPU(s): $(cut -d, -f2 <<<"$query" | sort | uniq -c | sed 's/^ *//' | paste -sd';')"
elif [ -n "$cards_arg" ]; then
  note "no nvidia-smi: no GPU summary (running --cards $cards_arg on what --bin holds)"
  record SKIP "device query" "no nvidia-smi (no GPU): simulated cards of --bin"
else
  die "no nvidia-smi: this check needs an NVIDIA GPU machine with its driver (or --bin <cpu build> --cards LIST)"
fi

# ---- 2. shared libraries (before anything runs a binary) ------------------------------------------------------------------------
echo
echo "================ 2. shared libraries (bundle lib/ + the machine's driver, cuBLAS, NCCL)"
missing_libs() {  # the "not found" sonames of every binary, and version errors
  local f
  for f in "$bin"/*; do
    if [ ! -x "$f" ] || [ ! -f "$f" ]; then continue; fi
    ldd "$f" 2>&1 | awk '/not found/ { print }' || true
  done | sort -u
}
missing="$(missing_libs)"
if [ -n "$missing" ]; then
  # Look for the missing libraries where CUDA toolkits, NCCL packages and pip wheels put them.
  cands=()
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13* /opt/cuda /usr/lib/x86_64-linux-gnu \
           /usr/lib64 /usr/local/lib /usr/local/nccl /opt/nccl; do
    [ -n "$d" ] || continue
    for sub in lib64 lib targets/x86_64-linux/lib ""; do
      [ -d "$d/$sub" ] && cands+=("$d/$sub")
    done
  done
  while IFS= read -r d; do cands+=("$d"); done < <(
    find /usr/lib/python3*/ /usr/local/lib/python3*/ "$HOME"/.local/lib/python3*/ /opt/conda/lib/python3*/ \
         /opt/*/.venv/lib/python3*/ /opt/*/lib/python3*/ \
         -maxdepth 5 -type d -path '*nvidia/*/lib' 2>/dev/null || true)
  extra=""
  while read -r soname _; do
    case "$soname" in lib*.so*) ;; *) continue ;; esac
    for d in "${cands[@]}"; do
      if [ -e "$d/$soname" ]; then
        case ":$extra:" in *":$d:"*) ;; *) extra="${extra:+$extra:}$d" ;; esac
        break
      fi
    done
  done < <(grep -v 'version' <<<"$missing" | awk '{ print $1 }')
  if [ -n "$extra" ]; then
    export LD_LIBRARY_PATH="$root/lib:$extra${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    note "found the missing libraries under $extra; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    missing="$(missing_libs)"
  fi
fi
if [ -n "$missing" ]; then
  printf '%s\n' "$missing" | awk '{ print "  " $0 }'
  record FAIL "shared libraries" "unresolved: $(awk '{ print $1 }' <<<"$missing" | sort -u | paste -sd' ')"
  die "unresolved shared libraries (above). libcuda.so.1 comes with the NVIDIA driver; libcublas.so.13 and
  libcublasLt.so.13 with the CUDA 13 toolkit (or pip nvidia-cublas); libnccl.so.2 with NCCL 2 (libnccl2 package
  or pip nvidia-nccl-cu13). Install them or put their folder in LD_LIBRARY_PATH. A 'version ... not found' line
  means this system's glibc/libstdc++ is older than the bundle needs (see MANIFEST.txt)."
fi
ldd "$bin/gpubox_train" | awk '{ printf "  %-26s %s\n", $1, $3 }' | grep -E 'cud|cublas|nccl|'"$root"'/lib' || true
note "every binary's libraries resolve"
record PASS "shared libraries" "every binary's libraries resolve"

echo
echo "================ 2b. peer-access matrix (gpubox_bench devices)"
if run_limited 300 "$out/device/gpubox_devices.txt" "$bin/gpubox_bench" devices &&
   run_limited 300 "$out/device/gpubox_devices.json" "$bin/gpubox_bench" devices --json; then
  cat "$out/device/gpubox_devices.txt"
  if grep -q '"peer_access"' "$out/device/gpubox_devices.json"; then
    zeros="$(grep -o '"peer_access": .*' "$out/device/gpubox_devices.json" | grep -o '0' | wc -l || true)"
    record PASS "peer access matrix" "$( ((zeros == 0)) && echo "every pair direct" || echo "$zeros pair(s) without P2P: NCCL routes them through the host")"
  else
    record PASS "peer access matrix" "simulated cards (cpu build): one host memory"
  fi
else
  tail -n 5 "$out/device/gpubox_devices.txt" | sed 's/^/  | /'
  record FAIL "peer access matrix" "gpubox_bench devices failed (device/gpubox_devices.txt)"
fi

# Card counts the machine has (a cpu build with --cards simulates them).
max_cards="$ngpu"
if ((ngpu == 0)) && [ -n "$cards_arg" ]; then max_cards="$(tr ',' '\n' <<<"$cards_arg" | sort -n | tail -n 1)"; fi
