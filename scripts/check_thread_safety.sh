#!/usr/bin/env bash
# Checks the GUARDED_BY-style annotations (common/thread_annotations.hpp) with clang's
# thread-safety analysis: every host .cpp of the cpu build's compile_commands.json is compiled by
# clang++ 14 with -fsyntax-only -Wthread-safety -Werror=thread-safety and the build's own include
# paths and defines. The build compiler stays g++; the annotations expand to nothing there.
# Files clang cannot parse (g++-only code) are listed and skipped, never silently.
#   scripts/check_thread_safety.sh [build-dir]     (default: build, configured for cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
db="$build/compile_commands.json"
if [ ! -f "$db" ]; then
  echo "check_thread_safety: $db not found (configure the cpu build first: scripts/build.sh cpu)" >&2
  exit 1
fi
clang=""
for candidate in clang++-14 clang++; do
  if command -v "$candidate" >/dev/null 2>&1; then clang="$candidate"; break; fi
done
if [ -z "$clang" ]; then
  echo "check_thread_safety: clang++ 14 not found (scripts/setup.sh --checks installs it)" >&2
  exit 1
fi
exec python3 - "$db" "$clang" "$PWD" <<'PY'
import json, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

db, clang, root = sys.argv[1], sys.argv[2], sys.argv[3]
entries = [e for e in json.load(open(db))
           if e["file"].endswith(".cpp") and e["file"].startswith(root + "/")
           and "/build" not in e["file"][len(root):]]
seen, todo = set(), []
for e in entries:
    if e["file"] in seen:
        continue
    seen.add(e["file"])
    args = shlex.split(e["command"]) if "command" in e else list(e["arguments"])
    keep, skip_next = [], False
    for a in args[1:]:
        if skip_next:
            skip_next = False
            continue
        if a in ("-o", "-c"):
            skip_next = a == "-o"
            continue
        if a.startswith("-I") or a.startswith("-D") or a.startswith("-std=") or a == "-isystem" \
                or a.startswith("-isystem") or a == "-fopenmp" or a.startswith("-x"):
            keep.append(a)
        elif keep and keep[-1] == "-isystem":
            keep.append(a)
    todo.append((e["file"], e["directory"],
                 [clang, "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
                  "-Wno-unknown-warning-option"] + keep + [e["file"]]))

def run(item):
    path, directory, cmd = item
    p = subprocess.run(cmd, cwd=directory, capture_output=True, text=True)
    return path, p.returncode, p.stderr

failed, skipped = [], []
with ThreadPoolExecutor(max_workers=2) as pool:
    for path, rc, err in pool.map(run, todo):
        rel = path[len(root) + 1:]
        if rc == 0:
            continue
        if "thread-safety" in err or "-Wthread-safety" in err:
            failed.append(rel)
            sys.stderr.write(err)
        else:
            first = next((l for l in err.splitlines() if "error" in l), err.strip()[:200])
            skipped.append((rel, first))
for rel, why in skipped:
    print(f"check_thread_safety: skipped {rel} (clang cannot compile it: {why})")
checked = len(todo) - len(skipped)
if failed:
    print(f"check_thread_safety: thread-safety errors in {len(failed)} of {checked} files: "
          + ", ".join(failed), file=sys.stderr)
    sys.exit(1)
print(f"check_thread_safety: {checked} host sources checked, {len(skipped)} skipped")
PY
