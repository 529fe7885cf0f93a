#!/usr/bin/env bash
# Installs what GPUBox needs to build from Debian's packages, only when something is missing.
# Idempotent and quiet when everything is there. Also checks for CCCL (Thrust/CUB/libcu++),
# which comes with the CUDA toolkit. --fuzz: also what the fuzz build needs (scripts/fuzz.sh).
# --checks: also what CI's source checks need (scripts/check_format.sh, check_thread_safety.sh).
set -euo pipefail

PACKAGES=(
  cmake g++ make pkg-config
  libgflags-dev        # command-line flags of every binary
  libyaml-cpp-dev      # config_gpubox.yaml
  libboost-dev         # Boost.Asio: gpubox_server and its client; Boost.Beast: gpubox_serve
  libdnnl-dev          # oneDNN: the dense net's GEMMs with fused bias/ReLU, bf16 where the CPU has it (cpu backend)
  nlohmann-json3-dev   # gpubox_serve: parsing JSON prediction requests (header-only)
  librocksdb-dev       # disk tier under the host table
  libgloo-dev          # Gloo: collectives over TCP between trainer processes (cpu backend, several trainers)
  libxxhash-dev        # hashing Criteo categoricals, checksums of saved models
  libssl-dev           # libcrypto: HMAC-SHA256 and random nonces of gpubox_server's challenge-response AUTH
  libgtest-dev libgmock-dev  # unit tests
  libbenchmark-dev     # micro-benchmarks
  libabsl-dev          # absl::flat_hash_map: the peer of the card hash table in gpubox_bench
  python3-minimal      # the tests' stand-in for PaddleRec's Python reader (pipe_command)
  gnuplot-nox          # scripts/plot_metrics.sh (and its test), bench_gpubox.sh's plot
  iproute2             # netns_partition_test: two network namespaces joined by a veth pair (run as root)
  openmpi-bin          # netns_mpirun_test: the same job launched by mpirun through an rsh agent
  pybind11-dev python3-dev  # the Python package's extension gpubox._core (python/)
  python3-numpy python3-pandas python3-pytest python3-venv  # the Python package and its tests
)
if [ "${1:-}" = "--checks" ]; then
  PACKAGES+=(
    clang-format-14      # scripts/check_format.sh: the repo's .clang-format, version 14
    clang-14             # scripts/check_thread_safety.sh: -Wthread-safety (syntax only)
    libomp-14-dev        # its omp.h: the sources it checks are built with -fopenmp
    ccache               # .ci/run: the cuda build reuses the cpu build's identical host objects
  )
fi
if [ "${1:-}" = "--fuzz" ]; then
  PACKAGES+=(
    clang-14             # the fuzz build's compiler (the normal build stays g++)
    libclang-rt-14-dev   # libFuzzer's runtime (-fsanitize=fuzzer) and ASan/UBSan
    libomp-14-dev        # OpenMP for clang (Thrust's OMP device system)
  )
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cuda_root="${GPUBOX_CUDA_ROOT:-/usr/local/cuda}"
if [ ! -f "$cuda_root/include/cccl/thrust/version.h" ] && [ ! -f "$cuda_root/include/thrust/version.h" ]; then
  echo "setup: CCCL (Thrust/CUB/libcu++) not found under $cuda_root/include." >&2
  echo "       Install the CUDA toolkit (it ships CCCL) or set GPUBOX_CUDA_ROOT." >&2
  exit 1
fi
