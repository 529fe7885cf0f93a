"""`pip install ./python` into a fresh virtual environment, then gpubox imported from it."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tarfile
import zipfile

from conftest import BUILD_DIR, SOURCE_DIR

import gpubox


def test_pip_install_into_a_fresh_venv(tmp_path: pathlib.Path) -> None:
    venv = tmp_path / "venv"
    # --system-site-packages: numpy from the system (no network needed).
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    # GPUBOX_BUILD_DIR: the backend packages this build's extension instead of compiling again.
    env = dict(os.environ, GPUBOX_BUILD_DIR=str(BUILD_DIR))
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "-q",
                              str(SOURCE_DIR / "python")],
                             env=env, capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
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
    assert where.startswith(str(venv))


def _venv(tmp_path: pathlib.Path) -> pathlib.Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    return venv / "bin" / "python"


def test_pip_install_editable_imports_the_source_tree(tmp_path: pathlib.Path) -> None:
    python = _venv(tmp_path)
    env = dict(os.environ, GPUBOX_BUILD_DIR=str(BUILD_DIR))
    install = subprocess.run([str(python), "-m", "pip", "install", "--no-index", "-q", "-e",
                              str(SOURCE_DIR / "python")],
                             env=env, capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
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
    env = dict(os.environ, GPUBOX_BUILD_DIR=str(BUILD_DIR))
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-index", "--no-deps", "-q",
                            "-w", str(out), str(sdist)],
                           env=env, capture_output=True, text=True, timeout=600)
    assert wheel.returncode == 0, wheel.stdout + wheel.stderr
    (built,) = out.glob("gpubox-*.whl")
    with zipfile.ZipFile(built) as whl:
        files = whl.namelist()
    assert "gpubox/__init__.py" in files and "gpubox/_progress.py" in files
    assert any(f.startswith("gpubox/_core") and f.endswith(".so") for f in files), files
