"""The package itself and its config loading: the binaries' loader, the binaries' errors."""

from __future__ import annotations

import pathlib

import pytest
from conftest import BIN, CONFIG, run_binary

import gpubox


def test_version_and_backend_are_the_binaries() -> None:
    version = run_binary("gpubox_train", "--version").stdout
    assert f" {gpubox.__version__} " in version
    assert f"backend {gpubox.backend})" in version


def test_overrides_apply_as_dash_o() -> None:
    config = gpubox.Config.from_yaml(CONFIG, {"runner.epochs": 4, "hyper_parameters.model": "fm",
                                              "hyper_parameters.fc_sizes": [8, 4]})
    assert config.epochs == 4
    assert config.model == "fm"
    assert config.overrides == ["runner.epochs=4", "hyper_parameters.model=fm",
                                "hyper_parameters.fc_sizes=[8, 4]"]


@pytest.mark.parametrize("overrides", [
    ["runner.no_such_key=1"],
    ["runner.epochs=many"],
    ["runner.sync_mode=bogus"],
])
def test_config_errors_are_gpubox_trains(overrides: list[str]) -> None:
    binary = run_binary("gpubox_train", "--config", str(CONFIG),
                        *[a for o in overrides for a in ("-o", o)], "--print_model_root")
    assert binary.returncode == 2
    with pytest.raises(gpubox.ConfigError) as raised:
        gpubox.Config.from_yaml(CONFIG, override_list=overrides)
    assert binary.stderr.strip() == f"gpubox_train: {raised.value}"


def test_missing_config_file(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "none.yaml"
    binary = run_binary("gpubox_train", "--config", str(missing))
    with pytest.raises(gpubox.ConfigError) as raised:
        gpubox.Config.from_yaml(missing)
    assert binary.stderr.strip() == f"gpubox_train: {raised.value}"
    assert isinstance(raised.value, ValueError)
