#!/usr/bin/env bash
# scripts/bundle_cuda.sh [--out DIR] [--no-build] [--archs LIST] [--max-mib N] [--cpu-build DIR | --no-cpu]
# scripts/bundle_cuda.sh --verify [TARBALL]
#
# Builds the CUDA variant (scripts/build.sh cuda -> build-cuda/, reused when up to date) and packs
# a GPU-ready bundle for a machine that has an NVIDIA driver and the CUDA 13 toolkit but maybe no
# package registry or internet:
#   bin/      gpubox_train, gpubox_server, gpubox_data, gpubox_bench, gpubox_serve, gpubox_fault_probe and every *_test binary of the
#             cuda build, RUNPATH $ORIGIN/../lib
#   lib/      every shared library they need (transitively) beyond glibc (libc, libm, libpthread,
#             libdl, librt, ld-linux), libstdc++/libgcc_s and the CUDA pieces that the GPU machine
#             provides; RUNPATH $ORIGIN. libcudart is bundled (0.7 MB). Not bundled (too large for
#             the 64 MiB limit; part of the CUDA toolkit / driver there): libcuda.so.1 (driver),
#             libcublas.so.13 + libcublasLt.so.13 (~600 MB), libnccl.so.2 (~210 MB, ~190 MB compressed).
#   cpu-bin/  gpubox_train of a cpu build of the same sources (--cpu-build DIR, default build/ when
#             it is a cpu build; --no-cpu leaves it out), RUNPATH $ORIGIN/../lib: gpu_check.sh's item
#             10 compares the GPU's predictions with it. Refused when that build is older than the
#             sources (ninja -n would rebuild it); about 2 MiB compressed.
#   configs/  the YAML configs and the shipped sample data (configs/data/)
#   scripts/gpu_check.sh   on the GPU machine, the first-GPU-run checklist (its items in
#                          scripts/gpu_check/*.sh): device query and peer-access matrix, the unit
#                          tests, compute-sanitizer, a 2-card NCCL run, an nsys profile, per-step
#                          device counts, a per-card-count benchmark, varying keys, an evaluation
#                          keeping its predictions, all under one output folder with a summary.txt.
#                          Run: tar xJf gpubox-cuda-*.tar.xz && gpubox-cuda-*/scripts/gpu_check.sh
#                          (scripts/gpu_lease_check.sh runs it in bounded phases for a short lease)
#   MANIFEST.txt, test_paths.txt + build-cuda/bin -> ../bin (the tests' compiled-in build paths:
#             gpu_check.sh links the build's source folder to the bundle when it is absent there)
# Output: DIR/gpubox-cuda-<commit>.tar.xz (default DIR: build-cuda-bundle/), refused if over
# --max-mib (default 64; over it, packed again with a 1.5 GiB dictionary that spans every
# binary: 68 → 48 MB at 455e5de): xz -9, whose 64 MiB window spans several binaries, since every test
# binary links the engine statically (38.7 MiB at 5b85648 with 88 binaries and oneDNN's 40 MB library; earlier, with fewer binaries and no oneDNN, 25 MiB against 54 MiB with xz -6 and 92 MiB with gzip). The bundle is then verified (see --verify).
#
# --verify [TARBALL] (default: the newest DIR/gpubox-cuda-*.tar.xz) extracts the tarball to a
# temporary folder and, with LD_LIBRARY_PATH empty, runs ldd on every bin/ and lib/ file: each
# dependency must resolve to the bundle's lib/, to the allowed system libraries above, or be one of
# the CUDA libraries the GPU machine provides; "not found" is accepted only for libcuda.so.1 (only
# an NVIDIA driver installs it; this machine has none). It also checks RUNPATHs, runs `bash -n` on
# gpu_check.sh, reports the newest glibc / libstdc++ symbol versions required, and starts
# gpubox_data from the extracted bundle.
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}
die() { echo "bundle_cuda: error: $*" >&2; exit 1; }

repo="$(cd "$(dirname "$0")/.." && pwd)"
out_dir="$repo/build-cuda-bundle"
build=1
archs=""
max_mib=64
mode=pack
verify_tar=""
cpu_build="$repo/build"
cpu_wanted=1
cpu_explicit=0
while (($#)); do
  case "$1" in
    --out) (($# >= 2)) || die "--out needs a folder"; out_dir="$2"; shift 2 ;;
    --out=*) out_dir="${1#--out=}"; shift ;;
    --no-build) build=0; shift ;;
    --archs) (($# >= 2)) || die "--archs needs a list such as \"80;90\""; archs="$2"; shift 2 ;;
    --max-mib) (($# >= 2)) || die "--max-mib needs a number"; max_mib="$2"; shift 2 ;;
    --verify)
      mode=verify; shift
      if (($#)) && [[ "$1" != --* ]]; then verify_tar="$1"; shift; fi ;;
    --cpu-build) (($# >= 2)) || die "--cpu-build needs a folder"; cpu_build="$2"; cpu_explicit=1; shift 2 ;;
    --no-cpu) cpu_wanted=0; shift ;;
    -h|--help) usage 0 ;;
    *) echo "bundle_cuda: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ "$max_mib" =~ ^[0-9]+$ ]] || die "--max-mib must be a whole number of MiB, got '$max_mib'"
[ -n "$out_dir" ] || die "--out must not be empty"
mkdir -p "$out_dir" || die "--out '$out_dir': cannot create the folder"
out_dir="$(cd "$out_dir" && pwd)"

build_dir="$repo/build-cuda"
tmp=""
cleanup() { if [ -n "$tmp" ] && [ -d "$tmp" ]; then rm -rf "$tmp"; fi; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- dependency classes -----------------------------------------------------------------------
# System libraries the bundle may rely on (glibc, the C++ runtime).
allowed_system_re='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libstdc\+\+\.so\.6|libgcc_s\.so\.1)$'
# Provided by the GPU machine: the driver, and the CUDA toolkit's cuBLAS and NCCL (too large to pack).
gpu_machine_re='^(libcuda\.so\.1|libcublas\.so\.[0-9]+|libcublasLt\.so\.[0-9]+|libnccl\.so\.[0-9]+)$'
# Only the driver library may be missing on this (GPU-less) machine.
may_be_missing_re='^libcuda\.so\.1$'

# ldd_deps FILE: "soname<TAB>path" per dependency ("not found" as path), LD_LIBRARY_PATH empty.
ldd_deps() {
  LD_LIBRARY_PATH= ldd "$1" 2>&1 | awk '
    /=>/ { name=$1; path=$3; if ($3 == "not") path="not found"; printf "%s\t%s\n", name, path; next }
    /ld-linux|linux-vdso/ { n=$1; sub(".*/", "", n); printf "%s\t%s\n", n, $1 }'
}

is_elf() { [ -f "$1" ] && [ "$(head -c 4 "$1" | od -An -c | tr -d ' ')" = "177ELF" ]; }

# ---- verify -------------------------------------------------------------------------------------
verify() {
  local tarball="$1"
  [ -f "$tarball" ] || die "--verify: no tarball '$tarball'"
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/gpubox-bundle-verify.XXXXXX")"
  tar -xJf "$tarball" -C "$tmp" || die "--verify: cannot extract '$tarball'"
  local root
  root="$(find "$tmp" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
  [ -n "$root" ] && [ -d "$root/bin" ] && [ -d "$root/lib" ] || die "--verify: '$tarball' has no <name>/bin and <name>/lib"
  echo "== verify $(basename "$tarball") ($(du -b "$tarball" | cut -f1) bytes) extracted to $root"
  echo "== ldd with LD_LIBRARY_PATH empty (bundle = $root/lib)"
  local bad=0 f dep path class rp line
  declare -A counts=()
  for f in "$root"/bin/* "$root"/cpu-bin/* "$root"/lib/*; do
    [ -e "$f" ] || continue
    is_elf "$f" || { echo "  $(basename "$f"): not an ELF file"; bad=1; continue; }
    local rel="${f#"$root"/}"
    rp="$(patchelf --print-rpath "$f" 2>/dev/null || true)"
    echo "-- $rel  (RUNPATH: ${rp:-none})"
    case "$rel" in
      bin/* | cpu-bin/*) [ "$rp" = '$ORIGIN/../lib' ] || { echo "   RUNPATH must be \$ORIGIN/../lib"; bad=1; } ;;
    esac
    while IFS=$'\t' read -r dep path; do
      [ -n "$dep" ] || continue
      if [[ "$path" == /* ]] && [ -e "$path" ]; then path="$(readlink -f "$path")"; fi
      if [ "$path" = "not found" ]; then
        if [[ "$dep" =~ $may_be_missing_re ]]; then class="not found here: NVIDIA driver library, present on the GPU machine"
        else class="NOT FOUND (error)"; bad=1; fi
      elif [[ "$path" == "$root/lib/"* ]]; then class="bundle lib/"
      elif [[ "$dep" =~ $allowed_system_re ]]; then class="system (allowed)"
      elif [[ "$dep" =~ $gpu_machine_re ]]; then class="CUDA toolkit of the GPU machine (not bundled)"
      else class="NOT ALLOWED: resolved outside the bundle (error)"; bad=1; fi
      printf '   %-34s %-44s %s\n' "$dep" "${path/#"$root"/<bundle>}" "$class"
      counts["$class"]=$(( ${counts["$class"]:-0} + 1 ))
    done < <(ldd_deps "$f")
  done
  echo "== dependency lines per class (over all bin/ and lib/ files):"
  for class in "${!counts[@]}"; do printf '   %5d  %s\n' "${counts[$class]}" "$class"; done | sort -k2
  echo "== bundled lib/ ($(ls "$root/lib" | wc -l) files, $(du -sh "$root/lib" | cut -f1))"
  ls -l "$root/lib" | awk 'NR > 1 { printf "   %10d  %s\n", $5, $9 }'
  echo "== newest symbol versions required (the GPU machine's glibc / libstdc++ must provide them)"
  local glibc glibcxx
  glibc="$(for f in "$root"/bin/* "$root"/lib/*; do objdump -T "$f" 2>/dev/null; done |
           grep -o 'GLIBC_[0-9.]*' | sort -u -V | tail -n 1 || true)"
  glibcxx="$(for f in "$root"/bin/* "$root"/lib/*; do objdump -T "$f" 2>/dev/null; done |
             grep -o 'GLIBCXX_[0-9.]*' | sort -u -V | tail -n 1 || true)"
  echo "   ${glibc:-none} (glibc), ${glibcxx:-none} (libstdc++)"
  echo "== bash -n scripts/gpu_check.sh"
  if bash -n "$root/scripts/gpu_check.sh"; then echo "   ok"; else echo "   syntax error"; bad=1; fi
  [ -x "$root/scripts/gpu_check.sh" ] || { echo "   scripts/gpu_check.sh is not executable"; bad=1; }
  if ! bash -n "$root/scripts/lib/gpu_check_lib.sh" 2>/dev/null; then
    echo "   scripts/lib/gpu_check_lib.sh (which gpu_check.sh sources) is missing or has a syntax error"; bad=1
  fi
  local part
  for part in common device tests gemm_fallback sanitizer nccl nsys step bench varying predictions; do
    if ! bash -n "$root/scripts/gpu_check/$part.sh" 2>/dev/null; then
      echo "   scripts/gpu_check/$part.sh (which gpu_check.sh sources) is missing or has a syntax error"; bad=1
    fi
  done
  echo "== libcuda.so.1"
  if [ "${counts["not found here: NVIDIA driver library, present on the GPU machine"]:-0}" = 0 ]; then
    echo "   no file lists it as NEEDED: libcudart (and cuBLAS / NCCL) open the driver's libcuda.so.1 with"
    echo "   dlopen at run time, so ldd shows no 'not found' on this GPU-less machine"
  else
    echo "   NEEDED by some files and not found here: only an NVIDIA driver installs it (accepted)"
  fi
  echo "== gpubox_data runs from the extracted bundle (LD_LIBRARY_PATH empty, no GPU needed)"
  if line="$(cd "$tmp" && LD_LIBRARY_PATH= "$root/bin/gpubox_data" gen --out "$tmp/smoke" \
             --lines 2000 --files 1 --seed 1 2>&1)"; then
    echo "   $line"
  else
    echo "   gpubox_data failed: $line"; bad=1
  fi
  echo "== cpu-bin/gpubox_train (item 10's reference) runs from the extracted bundle"
  if [ ! -e "$root/cpu-bin/gpubox_train" ]; then
    echo "   not bundled (--no-cpu, or no cpu build): gpu_check.sh needs --cpu-bin for item 10's comparison"
  elif line="$(LD_LIBRARY_PATH= "$root/cpu-bin/gpubox_train" --version 2>&1 | head -n 1)" &&
       [[ "$line" == *"backend cpu"* ]]; then
    echo "   $line"
  else
    echo "   cpu-bin/gpubox_train --version did not say backend cpu: $line"; bad=1
  fi
  if ((bad)); then
    echo "== bundle verification FAILED (see the errors above)"
    return 1
  fi
  echo "== bundle verification passed"
}

if [ "$mode" = verify ]; then
  command -v patchelf >/dev/null || die "patchelf is missing (apt-get install patchelf)"
  if [ -z "$verify_tar" ]; then
    verify_tar="$(ls -t "$out_dir"/gpubox-cuda-*.tar.xz 2>/dev/null | head -n 1 || true)"
    [ -n "$verify_tar" ] || die "--verify: no gpubox-cuda-*.tar.xz in '$out_dir' (give the tarball or --out)"
  fi
  verify "$verify_tar"
  exit $?
fi

# ---- build --------------------------------------------------------------------------------------
if ! command -v patchelf >/dev/null; then
  echo "bundle_cuda: installing patchelf (Debian package)"
  if [ "$(id -u)" = 0 ]; then apt-get install -y patchelf >/dev/null || die "apt-get install patchelf failed"
  else sudo apt-get install -y patchelf >/dev/null || die "apt-get install patchelf failed (need root)"; fi
fi
for tool in ldd objdump strings strip tar xz; do command -v "$tool" >/dev/null || die "'$tool' is missing"; done

if ((build)); then
  extra=(-DGPUBOX_CUDA_LINEINFO=ON)  # source lines in gpu_check.sh's sanitizer reports
  [ -z "$archs" ] || extra+=(-DCMAKE_CUDA_ARCHITECTURES="$archs")
  echo "bundle_cuda: scripts/build.sh cuda ${extra[*]:-} (no-op when build-cuda/ is up to date)"
  "$repo/scripts/build.sh" cuda "${extra[@]}" || die "the cuda build failed (scripts/build.sh cuda)"
else
  [ -z "$archs" ] || die "--archs needs a build; drop --no-build"
fi
[ -f "$build_dir/CMakeCache.txt" ] || die "no cuda build in $build_dir (run without --no-build)"
grep -q '^GPUBOX_BACKEND:STRING=cuda$' "$build_dir/CMakeCache.txt" ||
  die "$build_dir is not a cuda build (GPUBOX_BACKEND != cuda)"
if ((!build)) && command -v ninja >/dev/null && [ -f "$build_dir/build.ninja" ] &&
   ninja -C "$build_dir" -n 2>/dev/null | grep -Eq '^\[[0-9]+/[0-9]+\] (Building|Linking)'; then
  echo "bundle_cuda: warning: $build_dir is not up to date with the sources (--no-build packs it as is)" >&2
fi

tools=(gpubox_train gpubox_server gpubox_data gpubox_bench gpubox_serve gpubox_fault_probe)
for t in "${tools[@]}"; do
  [ -x "$build_dir/bin/$t" ] || die "$build_dir/bin/$t is missing: the cuda build is incomplete"
done
mapfile -t tests < <(cd "$build_dir/bin" && ls | grep '_test$' | sort)
((${#tests[@]})) || die "no *_test binaries in $build_dir/bin (GPUBOX_BUILD_TESTS off?)"

# The cpu build for cpu-bin/: named or build/, a cpu build, up to date with the sources.
cpu_train=""
if ((cpu_wanted)); then
  if [ -f "$cpu_build/CMakeCache.txt" ] && grep -q '^GPUBOX_BACKEND:STRING=cpu$' "$cpu_build/CMakeCache.txt" &&
     [ -x "$cpu_build/bin/gpubox_train" ]; then
    if command -v ninja >/dev/null && [ -f "$cpu_build/build.ninja" ] &&
       ninja -C "$cpu_build" -n gpubox_train 2>/dev/null | grep -Eq '^\[[0-9]+/[0-9]+\] (Building|Linking)'; then
      die "$cpu_build/bin/gpubox_train is older than the sources: run 'ninja -C $cpu_build gpubox_train' (or --no-cpu)"
    fi
    cpu_train="$cpu_build/bin/gpubox_train"
  elif ((cpu_explicit)); then
    die "--cpu-build '$cpu_build' is no cpu build with bin/gpubox_train (GPUBOX_BACKEND=cpu; scripts/build.sh cpu)"
  else
    echo "bundle_cuda: no cpu build in $cpu_build: cpu-bin/ left out (gpu_check.sh item 10 then needs --cpu-bin)" >&2
  fi
fi

commit="$(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
dirty=""
git -C "$repo" diff --quiet HEAD -- 2>/dev/null || dirty="-dirty"
name="gpubox-cuda-$commit$dirty"
cuda_archs="$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build_dir/CMakeCache.txt")"
[ -n "$cuda_archs" ] || cuda_archs="90 (project default)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/gpubox-bundle.XXXXXX")"
stage="$tmp/$name"
mkdir -p "$stage/bin" "$stage/lib" "$stage/scripts"

# ---- bin/ ---------------------------------------------------------------------------------------
for t in "${tools[@]}" "${tests[@]}"; do
  cp "$build_dir/bin/$t" "$stage/bin/$t"
  strip --strip-unneeded "$stage/bin/$t" 2>/dev/null || true
done
if [ -n "$cpu_train" ]; then
  mkdir -p "$stage/cpu-bin"
  cp "$cpu_train" "$stage/cpu-bin/gpubox_train"
  strip --strip-unneeded "$stage/cpu-bin/gpubox_train" 2>/dev/null || true
fi

# ---- lib/: the transitive closure of dependencies that are neither allowed system libraries nor
# provided by the GPU machine. ldd lists the whole closure of each file.
declare -A picked=()
for f in "$stage"/bin/* "$stage"/cpu-bin/*; do
  [ -e "$f" ] || continue
  while IFS=$'\t' read -r dep path; do
    [[ "$dep" =~ $allowed_system_re || "$dep" =~ $gpu_machine_re ]] && continue
    [ "$path" != "not found" ] || die "$(basename "$f") needs $dep, which is not found on this machine"
    picked["$dep"]="$path"
  done < <(ldd_deps "$f")
done
for dep in "${!picked[@]}"; do
  cp -L "${picked[$dep]}" "$stage/lib/$dep"
  chmod u+w "$stage/lib/$dep"
done

# ---- RUNPATHs: binaries look in ../lib, bundled libraries next to themselves (RUNPATH is not
# inherited by a library's own dependencies, so each bundled library carries one).
for f in "$stage"/bin/* "$stage"/cpu-bin/*; do [ -e "$f" ] && patchelf --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$stage"/lib/*; do
  needs_bundled=0
  while read -r needed; do
    [ -e "$stage/lib/$needed" ] && needs_bundled=1
  done < <(patchelf --print-needed "$f")
  if ((needs_bundled)); then patchelf --set-rpath '$ORIGIN' "$f"; fi
done

# ---- configs, sample data, scripts ---------------------------------------------------------------
cp -r "$repo/configs" "$stage/configs"
cp "$repo/scripts/gpu_check.sh" "$stage/scripts/gpu_check.sh"
mkdir -p "$stage/scripts/lib"
cp "$repo/scripts/lib/gpu_check_lib.sh" "$stage/scripts/lib/gpu_check_lib.sh"
mkdir -p "$stage/scripts/gpu_check"
cp "$repo"/scripts/gpu_check/*.sh "$stage/scripts/gpu_check/"
chmod +x "$stage/scripts/gpu_check.sh"

# Compiled-in build paths: some tests open files through absolute paths given by -D at compile time
# (GPUBOX_SOURCE_DIR -> <source>/configs, GPUBOX_DATA_BIN / GPUBOX_SERVER_BINARY -> build-cuda/bin).
# The bundle mirrors that layout (configs/ at its root, build-cuda/bin -> ../bin), so one symlink
# <source> -> <bundle> serves them all; gpu_check.sh makes it when <source> is absent there.
[ -f "$build_dir/compile_commands.json" ] || die "$build_dir/compile_commands.json is missing (CMAKE_EXPORT_COMPILE_COMMANDS)"
build_rel="${build_dir#"$repo"/}"
mkdir -p "$stage/$build_rel"
ln -s ../bin "$stage/$build_rel/bin"
{
  printf '# macro\tpath compiled into the test\ttest (source_dir: the source folder of the build)\n'
  printf 'source_dir\t%s\n' "$repo"
  sed 's/\\\\\\"/"/g' "$build_dir/compile_commands.json" | awk -v repo="$repo" '{
    if (!match($0, /CMakeFiles\/[A-Za-z0-9_]+\.dir/)) next
    tgt = substr($0, RSTART + 11, RLENGTH - 15)
    s = $0
    while (match(s, /-D[A-Za-z0-9_]+="[^"]*"/)) {
      d = substr(s, RSTART + 2, RLENGTH - 3); s = substr(s, RSTART + RLENGTH)
      eq = index(d, "=\""); name = substr(d, 1, eq - 1); val = substr(d, eq + 2)
      if (index(val, repo) == 1) print name "\t" val "\t" tgt
    }
  }' | sort -u | while IFS=$'\t' read -r macro val tgt; do
    [ -x "$stage/bin/$tgt" ] || continue
    rel="${val#"$repo"}"; rel="${rel#/}"
    [ -e "$stage/${rel:-.}" ] || die "$tgt opens $val, which has no counterpart '${rel}' in the bundle"
    printf '%s\t%s\t%s\n' "$macro" "$val" "$tgt"
  done
} > "$stage/test_paths.txt"

{
  echo "GPUBox CUDA bundle $name"
  echo "built:        $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -sr), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "commit:       $(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)$dirty"
  echo "nvcc:         $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' || echo unknown)"
  echo "cuda archs:   $cuda_archs (a GPU of another compute capability needs a bundle built with --archs)"
  echo "lineinfo:     $(sed -n 's/^GPUBOX_CUDA_LINEINFO:BOOL=//p' "$build_dir/CMakeCache.txt" | grep . || echo OFF) (GPUBOX_CUDA_LINEINFO: device source lines in sanitizer reports)"
  echo "run:          scripts/gpu_check.sh            (the first-GPU-run checklist: summary.txt)"
  echo "              bin/gpubox_train --config configs/config_gpubox.yaml"
  echo "bin/:         ${tools[*]} ${tests[*]}"
  echo "cpu-bin/:     $([ -n "$cpu_train" ] && echo "gpubox_train of the cpu build $cpu_build (gpu_check.sh item 10's reference predictions)" || echo "none (--no-cpu or no cpu build)")"
  echo "lib/ (bundled, RUNPATH \$ORIGIN): $(cd "$stage/lib" && ls | paste -sd' ')"
  echo "from the system:  glibc (libc, libm, libpthread, libdl, librt, ld-linux), libstdc++, libgcc_s"
  echo "from the GPU machine (not bundled: size): libcuda.so.1 (NVIDIA driver, >= 580 for CUDA 13),"
  echo "              libcublas.so.13, libcublasLt.so.13 (CUDA 13 toolkit), libnccl.so.2 (NCCL 2)"
} > "$stage/MANIFEST.txt"

# ---- pack ---------------------------------------------------------------------------------------
tarball="$out_dir/$name.tar.xz"
rm -f "$tarball"
XZ_OPT="${XZ_OPT:--9 -T0}" tar -C "$tmp" -cJf "$tarball.part" "$name" || die "tar failed"
size="$(du -b "$tarball.part" | cut -f1)"
limit=$((max_mib * 1024 * 1024))
if ((size > limit)); then
  # Over: once more with a dictionary that spans every binary (one thread: xz's threads split the
  # input into blocks that share nothing). Slower (10 min on 2 cores) and about 17 GiB of memory
  # (xz: 11.5 times the dictionary); the second H200 lease's bundle went from 68 MB to 48 so.
  echo "bundle_cuda: $size bytes with xz -9, over ${max_mib} MiB: packing again with a 1.5 GiB dictionary"
  rm -f "$tarball.part"
  XZ_OPT="-6e --lzma2=preset=6e,dict=1536MiB -T1" tar -C "$tmp" -cJf "$tarball.part" "$name" ||
    die "tar failed"
  size="$(du -b "$tarball.part" | cut -f1)"
fi
if ((size > limit)); then
  rm -f "$tarball.part"
  die "the bundle is $size bytes ($((size / 1024 / 1024)) MiB), over the ${max_mib} MiB limit; largest files (uncompressed): $(cd "$stage" && du -b bin/* lib/* | sort -rn | head -n 5 | awk '{ printf "%s %.1f MB; ", $2, $1 / 1e6 }')$([ -n "$cpu_train" ] && echo " --no-cpu leaves out cpu-bin/ and the oneDNN it needs")"
fi
mv "$tarball.part" "$tarball"
echo "bundle_cuda: wrote $tarball ($size bytes, $(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1048576 }') MiB of ${max_mib} MiB)"
echo "bundle_cuda: bin/ $(ls "$stage/bin" | wc -l) files, lib/ $(ls "$stage/lib" | wc -l) files: $(cd "$stage/lib" && ls | paste -sd' ')"
rm -rf "$tmp"; tmp=""
verify "$tarball"
