"""The gpubox package's PEP 517 build backend: builds the extension with the project's CMake.

``pip install ./python`` calls :func:`build_wheel`, which needs nothing from PyPI:

* With ``GPUBOX_BUILD_DIR`` naming a configured build tree of the repository (scripts/build.sh's
  ``build/``), it brings the target ``gpubox_core`` up to date there (nothing to do when the
  tree is built) and packages that extension: seconds.
* Otherwise it configures ``<repo>/build-python`` (``GPUBOX_PYTHON_BUILD_DIR`` overrides it)
  for this interpreter and builds only ``gpubox_core`` and the engine libraries it links
  (``GPUBOX_BACKEND``: cpu (default) or cuda; ``GPUBOX_JOBS``: parallel jobs). On a fresh
  machine this compiles the engine: minutes (ccache makes a rebuild quick).

The wheel holds python/gpubox and the extension; the extension links the system libraries the
engine uses (scripts/setup.sh installs them), so it is for this machine, not for PyPI.

``pip install -e ./python`` calls :func:`build_editable` (PEP 660): the extension is built the
same way, and the wheel installs only an import hook that loads ``gpubox`` from python/gpubox
with the extension from the build tree: edits to the package's modules take effect at the next
import, a rebuilt extension (``cmake --build <tree> --target gpubox_core``) at the next start.

:func:`build_sdist` writes the repository's tracked files (the engine's sources: the
extension cannot be built without them) with this package's pyproject.toml at its root, so
that ``pip install gpubox-<version>.tar.gz`` builds as ``pip install ./python`` does.
"""

from __future__ import annotations

import base64
import hashlib
import os
import pathlib
import re
import io
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from typing import Any, Optional

PACKAGE_DIR = pathlib.Path(__file__).resolve().parents[1]  # python/
SOURCE_DIR = PACKAGE_DIR.parent  # the repository


def _version() -> str:
    """The project's version, from the root CMakeLists.txt (gpubox_train --version's)."""
    text = (SOURCE_DIR / "CMakeLists.txt").read_text()
    found = re.search(r"project\(gpubox VERSION ([0-9.]+)", text)
    if not found:
        raise RuntimeError("no 'project(gpubox VERSION x.y.z' in the root CMakeLists.txt")
    return found.group(1)


def _run(command: list[str]) -> None:
    print("gpubox build:", " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


def _build_extension() -> pathlib.Path:
    """Builds gpubox_core and returns the path of the extension for this interpreter."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    jobs = os.environ.get("GPUBOX_JOBS", str(os.cpu_count() or 1))
    reuse = os.environ.get("GPUBOX_BUILD_DIR")
    if reuse:
        # pip runs this hook in the package's folder (python/), not where it was started: a
        # relative tree (the README's GPUBOX_BUILD_DIR=build) is the repository's.
        build = pathlib.Path(reuse)
        if not build.is_absolute():
            build = SOURCE_DIR / build
        build = build.resolve()
        if not (build / "CMakeCache.txt").is_file():
            raise RuntimeError(f"GPUBOX_BUILD_DIR={reuse} ({build}): not a configured CMake "
                               "build tree")
    else:
        build = pathlib.Path(os.environ.get("GPUBOX_PYTHON_BUILD_DIR",
                                            SOURCE_DIR / "build-python")).resolve()
        if not (build / "CMakeCache.txt").is_file():
            generator = ["-G", "Ninja"] if _has("ninja") else []
            _run(["cmake", "-S", str(SOURCE_DIR), "-B", str(build), *generator,
                  f"-DGPUBOX_BACKEND={os.environ.get('GPUBOX_BACKEND', 'cpu')}",
                  "-DCMAKE_BUILD_TYPE=Release", "-DGPUBOX_PYTHON=ON",
                  f"-DPython3_EXECUTABLE={sys.executable}",
                  "-DGPUBOX_BUILD_TESTS=OFF", "-DGPUBOX_BUILD_BENCHMARKS=OFF"])
    _run(["cmake", "--build", str(build), "--target", "gpubox_core", "-j", jobs])
    extension = build / "python" / "gpubox" / f"_core{suffix}"
    if not extension.is_file():
        built = sorted(p.name for p in (build / "python" / "gpubox").glob("_core*"))
        raise RuntimeError(f"{build} holds no extension for this Python ({extension.name}; "
                           f"built: {built or 'none'}): configure it with "
                           f"-DPython3_EXECUTABLE={sys.executable}, or unset GPUBOX_BUILD_DIR")
    return extension


def _has(program: str) -> bool:
    return any((pathlib.Path(d) / program).is_file()
               for d in os.environ.get("PATH", "").split(os.pathsep) if d)


def _wheel_tag() -> str:
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{python}-{python}{sys.abiflags}-{platform}"


def _metadata(version: str) -> str:
    return (f"Metadata-Version: 2.1\nName: gpubox\nVersion: {version}\n"
            "Summary: GPUBox from Python: train, evaluate and predict with the GPUBox engine\n"
            "Requires-Python: >=3.9\nRequires-Dist: numpy\n"
            "Provides-Extra: pandas\nRequires-Dist: pandas; extra == \"pandas\"\n")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory: str, files: dict[str, bytes]) -> str:
    """A wheel of `files` (path in the wheel -> bytes) with its dist-info; its file name."""
    version = _version()
    info = f"gpubox-{version}.dist-info"
    files[f"{info}/METADATA"] = _metadata(version).encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: gpubox_build\n"
                              f"Root-Is-Purelib: false\nTag: {_wheel_tag()}\n").encode()
    files[f"{info}/top_level.txt"] = b"gpubox\n"
    record = [_record_line(name, data) for name, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"gpubox-{version}-{_wheel_tag()}.whl"
    with zipfile.ZipFile(pathlib.Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as whl:
        for path, data in files.items():
            whl.writestr(path, data)
    return name


def build_wheel(wheel_directory: str, config_settings: Optional[dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    """PEP 517: builds the extension and writes the wheel; returns its file name."""
    extension = _build_extension()
    files: dict[str, bytes] = {}
    for module in sorted((PACKAGE_DIR / "gpubox").iterdir()):
        if module.suffix in (".py", ".pyi", ".typed"):
            files[f"gpubox/{module.name}"] = module.read_bytes()
    files[f"gpubox/{extension.name}"] = extension.read_bytes()
    return _write_wheel(wheel_directory, files)


# The editable install's import hook: `gpubox` from the source tree's python/gpubox, its
# submodules from there and from the build tree's python/gpubox (the extension).
_EDITABLE_HOOK = '''"""gpubox installed in editable mode (pip install -e): see gpubox_build.py."""
import importlib.util
import sys

SOURCE = {source!r}
BUILT = {built!r}


class GpuboxEditableFinder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != "gpubox":
            return None
        return importlib.util.spec_from_file_location(
            name, SOURCE + "/__init__.py", submodule_search_locations=[SOURCE, BUILT])


if not any(f is GpuboxEditableFinder for f in sys.meta_path):
    sys.meta_path.insert(0, GpuboxEditableFinder)
'''


def build_editable(wheel_directory: str, config_settings: Optional[dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    """PEP 660: builds the extension where build_wheel would and writes a wheel that imports
    gpubox from python/gpubox and the extension from the build tree; returns its file name."""
    extension = _build_extension()
    hook = _EDITABLE_HOOK.format(source=str(PACKAGE_DIR / "gpubox"),
                                 built=str(extension.parent))
    files = {"_gpubox_editable.py": hook.encode(),
             "_gpubox_editable.pth": b"import _gpubox_editable\n"}
    return _write_wheel(wheel_directory, files)


def _tracked_files() -> list[str]:
    """The repository's files as git tracks them (a tree without git: every file outside the
    build trees and log folders .gitignore names)."""
    if (SOURCE_DIR / ".git").exists():
        listed = subprocess.run(["git", "-C", str(SOURCE_DIR), "ls-files", "-z"], check=True,
                                capture_output=True).stdout.decode()
        return sorted(f for f in listed.split("\0") if f and (SOURCE_DIR / f).is_file())
    skipped = re.compile(r"^(build[^/]*|log|output|bench-out)/|(^|/)__pycache__/|\.swp$")
    files = (p.relative_to(SOURCE_DIR).as_posix() for p in SOURCE_DIR.rglob("*") if p.is_file())
    return sorted(f for f in files if not skipped.search(f))


def build_sdist(sdist_directory: str, config_settings: Optional[dict[str, Any]] = None) -> str:
    """PEP 517: gpubox-<version>.tar.gz, the repository's tracked files with this package's
    pyproject.toml (backend path python/build_backend) and PKG-INFO at the root; returns its
    file name. Nothing is built."""
    version = _version()
    root = f"gpubox-{version}"
    pyproject = (PACKAGE_DIR / "pyproject.toml").read_text()
    pyproject = pyproject.replace('backend-path = ["build_backend"]',
                                  'backend-path = ["python/build_backend"]')
    if 'backend-path = ["python/build_backend"]' not in pyproject:
        raise RuntimeError("python/pyproject.toml: no backend-path = [\"build_backend\"]")
    generated = {"pyproject.toml": pyproject.encode(), "PKG-INFO": _metadata(version).encode()}
    name = f"{root}.tar.gz"

    def add(tar: tarfile.TarFile, path: str, data: bytes, mode: int) -> None:
        info = tarfile.TarInfo(f"{root}/{path}")
        info.size, info.mode, info.mtime = len(data), mode, 0
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(pathlib.Path(sdist_directory) / name, "w:gz",
                      format=tarfile.PAX_FORMAT) as tar:
        for path in _tracked_files():
            if path in generated:
                continue
            source = SOURCE_DIR / path
            add(tar, path, source.read_bytes(), 0o755 if os.access(source, os.X_OK) else 0o644)
        for path, data in generated.items():
            add(tar, path, data, 0o644)
    return name


def get_requires_for_build_wheel(config_settings: Optional[dict[str, Any]] = None) -> list[str]:
    """PEP 517: nothing from PyPI (CMake, a compiler and pybind11-dev come from setup.sh)."""
    return []


get_requires_for_build_editable = get_requires_for_build_wheel  # PEP 660
get_requires_for_build_sdist = get_requires_for_build_wheel


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[dict[str, Any]] = None) -> str:
    """PEP 517: the metadata alone, without building the extension."""
    info = pathlib.Path(metadata_directory) / f"gpubox-{_version()}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(_metadata(_version()))
    return info.name


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel  # PEP 660
