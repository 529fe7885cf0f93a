"""`pip install ./python` into a fresh virtual environment, then gpubox imported from it.

The build backend is pointed at this build (GPUBOX_BUILD_DIR) with a `cmake` of the tests' own
first on PATH that records what it is asked and builds nothing: the backend's
`cmake --build <tree> --target gpubox_core` would relink the build tree's _core.so in the middle of
the suite (its build stamp changes), under the tests that import it, and race any build of that
tree. The tree's extension, built before the tests, is only read.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import sys
import tarfile
import zipfile

from conftest import BUILD_DIR, SOURCE_DIR

import gpubox


def _venv(tmp_path: pathlib.Path) -> pathlib.Path:
    """A fresh virtual environment in tmp_path/venv (numpy from the system: no network)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    return venv / "bin" / "python"


def _backend_env(tmp_path: pathlib.Path) -> tuple[dict[str, str], pathlib.Path]:
    """The environment for pip to run the build backend in (see the module's docstring), and the
    file where the recording `cmake` writes each call's arguments, a line each."""
    fake_bin = tmp_path / "fake-bin"
    fake_bin.mkdir()
    calls = tmp_path / "cmake-calls.txt"
    cmake = fake_bin / "cmake"
    cmake.write_text(f'#!/bin/sh\necho "$*" >> {shlex.quote(str(calls))}\n')
    cmake.chmod(0o755)
    env = dict(os.environ, GPUBOX_BUILD_DIR=str(BUILD_DIR), GPUBOX_JOBS="1",
               PATH=f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    return env, calls


def _assert_built_only_the_extension(calls: pathlib.Path) -> None:
    """The backend asked CMake for the extension of this build, once, and for nothing else."""
    assert calls.read_text().splitlines() == [
        f"--build {BUILD_DIR.resolve()} --target gpubox_core -j 1"]


def test_pip_install_into_a_fresh_venv(tmp_path: pathlib.Path) -> None:
    python = _venv(tmp_path)
    # GPUBOX_BUILD_DIR: the backend packages this build's extension instead of compiling again.
    env, calls = _backend_env(tmp_path)
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "-q",
                              str(SOURCE_DIR / "python")],
                             env=env, capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    _assert_built_only_the_extension(calls)
    # From another folder, with no path set: the installed package, not the source tree.
    probe = subprocess.run(
        [str(python), "-c", "import gpubox, sys; "
         "print(gpubox.__version__, gpubox.backend, gpubox.__file__); "
         f"c = gpubox.Config.from_yaml({str(SOURCE_DIR / 'configs' / 'config_gpubox.yaml')!r}, "
         "{'runner.epochs': 5}); print(c.epochs)"],
        cwd=tmp_path, capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert probe.returncode == 0, probe.stderr
    version, backend, where, epochs = probe.stdout.split()
    assert (version, backend, epochs) == (gpubox.__version__, gpubox.backend, "5")
    assert where.startswith(str(tmp_path / "venv"))


def test_pip_install_editable_imports_the_source_tree(tmp_path: pathlib.Path) -> None:
    python = _venv(tmp_path)
    env, calls = _backend_env(tmp_path)
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "-q", "-e",
                              str(SOURCE_DIR / "python")],
                             env=env, capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    _assert_built_only_the_extension(calls)
    probe = subprocess.run(
        [str(python), "-c", "import gpubox, gpubox._core as c; "
         "print(gpubox.__file__, c.__file__, gpubox.__version__)"],
        cwd=tmp_path, capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert probe.returncode == 0, probe.stderr
    package, core, version = probe.stdout.split()
    # The modules from the source tree (an edit takes effect), the extension from the build.
    assert package == str(SOURCE_DIR / "python" / "gpubox" / "__init__.py")
    assert pathlib.Path(core).parent == BUILD_DIR / "python" / "gpubox"
    assert version == gpubox.__version__


def test_sdist_holds_the_engine_and_builds_a_wheel(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "dist"
    out.mkdir()
    made = subprocess.run(
        [sys.executable, "-c",
         "import sys, gpubox_build; print(gpubox_build.build_sdist(sys.argv[1]))", str(out)],
        cwd=SOURCE_DIR / "python" / "build_backend", capture_output=True, text=True, check=True)
    sdist = out / made.stdout.strip()
    root = f"gpubox-{gpubox.__version__}"
    assert sdist.name == f"{root}.tar.gz"
    with tarfile.open(sdist) as tar:
        names = set(tar.getnames())
        pyproject = tar.extractfile(f"{root}/pyproject.toml").read().decode()  # type: ignore
    for needed in ("pyproject.toml", "PKG-INFO", "CMakeLists.txt", "python/src/train_binding.cpp",
                   "python/build_backend/gpubox_build.py", "python/gpubox/__init__.py",
                   "trainer/engine/trainer.cpp"):
        assert f"{root}/{needed}" in names, needed
    assert not any(n.startswith(f"{root}/build") for n in names)  # no build tree
    assert 'backend-path = ["python/build_backend"]' in pyproject
    # pip builds the sdist's wheel offline (the extension of this build, as GPUBOX_BUILD_DIR
    # says: the sdist would otherwise compile the engine).
    env, calls = _backend_env(tmp_path)
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-index", "--no-deps", "-q",
                            "-w", str(out), str(sdist)],
                           env=env, capture_output=True, text=True, timeout=600)
    assert wheel.returncode == 0, wheel.stdout + wheel.stderr
    _assert_built_only_the_extension(calls)
    (built,) = out.glob("gpubox-*.whl")
    with zipfile.ZipFile(built) as whl:
        files = whl.namelist()
    assert "gpubox/__init__.py" in files and "gpubox/_progress.py" in files
    assert any(f.startswith("gpubox/_core") and f.endswith(".so") for f in files), files
