"""Fixtures of the gpubox package's tests: the build tree under test, planted data, a model.

GPUBOX_BUILD_DIR names the CMake build tree (ctest sets it; default: <repo>/build): the
extension is imported from <build>/python and the binaries run from <build>/bin, so the
package and the binaries under comparison come from one build.
"""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("GPUBOX_SOURCE_DIR",
                                         pathlib.Path(__file__).resolve().parents[2]))
BUILD_DIR = pathlib.Path(os.environ.get("GPUBOX_BUILD_DIR", SOURCE_DIR / "build"))
BIN = BUILD_DIR / "bin"



def _stage_package() -> pathlib.Path:
    """The package as installed: python/gpubox's modules beside this build's extension
    (links in a temporary folder, so neither tree is written to)."""
    stage = pathlib.Path(tempfile.mkdtemp(prefix="gpubox-pkg-"))
    (stage / "gpubox").mkdir()
    for module in (SOURCE_DIR / "python" / "gpubox").iterdir():
        if module.suffix in (".py", ".pyi", ".typed"):
            (stage / "gpubox" / module.name).symlink_to(module)
    for core in (BUILD_DIR / "python" / "gpubox").glob("_core*.so"):
        (stage / "gpubox" / core.name).symlink_to(core)
    atexit.register(shutil.rmtree, stage, True)
    return stage


sys.path.insert(0, str(_stage_package()))
import gpubox  # noqa: E402

# tests/dataset/planted_data.hpp's data (configs/config_synthetic.yaml's settings, scaled down)
# and the sizes tests/integration/collective_test.cpp trains it with.
PLANTED_GEN = ["--files", "4", "--seed", "7", "--slots", "8", "--dense", "3", "--vocab", "10000",
               "--zipf", "2.0", "--factor_dim", "1"]
PLANTED_OVERRIDES: dict[str, Any] = {
    "runner.train_batch_size": 256,
    "runner.print_interval": 1000000,
    "runner.shuffle": False,
    "runner.thread_num": 1,
    "runner.infer_load_path": "",
    "hyper_parameters.sparse_inputs_slots": 9,
    "hyper_parameters.dense_input_dim": 3,
    "hyper_parameters.fc_sizes": [128, 64],
}
PLANTED_TOLERANCE = 0.02  # collective_test.cpp's kPlantedTolerance (issue 16)
CONFIG = SOURCE_DIR / "configs" / "config_gpubox.yaml"


def run_binary(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    """Runs a binary of the build under test (one simulated card); output captured as text."""
    env = dict(os.environ, FLAGS_selected_gpus="0")
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def read_slot_text(path: pathlib.Path) -> dict[str, list[Any]]:
    """Slot text lines as columns (test code: a DataFrame's worth of the same instances)."""
    columns: dict[str, list[Any]] = {"click": [], "dense_feature": []}
    for line in path.read_text().splitlines():
        row: dict[str, list[float]] = {}
        for token in line.split():
            name, value = token.split(":")
            row.setdefault(name, []).append(float(value) if "." in value else int(value))
        columns["click"].append(row.pop("click")[0])
        columns["dense_feature"].append(row.pop("dense_feature"))
        for name, ids in row.items():
            columns.setdefault(name, []).append(ids)
    return columns


@pytest.fixture(scope="session", autouse=True)
def one_card() -> None:
    """Every run in this process on one simulated card, as the binaries run above."""
    os.environ["FLAGS_selected_gpus"] = "0"


@pytest.fixture(scope="session")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """40,000 training lines in 4 files and 5,000 held-out lines of one planted model."""
    root = tmp_path_factory.mktemp("planted")
    train = run_binary("gpubox_data", "gen", "--out", str(root / "train"), "--lines", "40000",
                       *PLANTED_GEN)
    assert train.returncode == 0, train.stderr
    test = run_binary("gpubox_data", "gen", "--out", str(root / "test"), "--lines", "5000",
                      *PLANTED_GEN[2:], "--files", "1", "--first_line", "40000")
    assert test.returncode == 0, test.stderr
    oracle = json.loads((root / "test" / "oracle.json").read_text())
    return {"root": root, "train": root / "train", "test": root / "test", "oracle": oracle}


def planted_config(planted: dict[str, Any], out: pathlib.Path, **more: Any) -> gpubox.Config:
    """config_gpubox.yaml sized to the planted data, saving every pass under out/model."""
    overrides = dict(PLANTED_OVERRIDES)
    overrides.update({
        "runner.train_data_dir": planted["train"],
        "runner.test_data_dir": planted["test"],
        "runner.model_save_path": out / "model",
        "runner.metrics_path": out / "metrics.jsonl",
        "runner.save_mode": "base",
        "runner.resume": "off",
    })
    overrides.update(more)
    return gpubox.Config.from_yaml(CONFIG, overrides)


@pytest.fixture(scope="session")
def trained(planted: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The planted data trained 3 epochs from Python (one save per pass)."""
    out = tmp_path_factory.mktemp("trained")
    config = planted_config(planted, out, **{"runner.epochs": 3})
    seen: list[gpubox.PassMetrics] = []
    result = gpubox.train(config, on_pass=seen.append)
    return {"config": config, "result": result, "seen": seen, "out": out}
