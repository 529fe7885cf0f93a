"""`pip install ./python` into a fresh virtual environment, then gpubox imported from it."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

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
