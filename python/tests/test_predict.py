"""gpubox.load(...).predict: equal to gpubox_train --mode infer on the same instances."""

from __future__ import annotations

import concurrent.futures
import pathlib
import warnings
from typing import Any

import numpy as np
import pytest
from conftest import CONFIG, planted_config, read_slot_text, run_binary

import gpubox


def dash_o(config: gpubox.Config) -> list[str]:
    return [a for o in config.overrides for a in ("-o", o)]


@pytest.fixture(scope="module")
def infer(trained: dict[str, Any], planted: dict[str, Any]) -> dict[str, Any]:
    """gpubox_train --mode infer's predictions of the held-out lines with the last save."""
    config: gpubox.Config = trained["config"]
    save = trained["out"] / "model" / "2"
    out = trained["out"] / "infer.txt"
    ran = run_binary("gpubox_train", "--config", str(CONFIG), *dash_o(config), "--mode", "infer",
                     "--load", str(save), "--infer_data_dir", str(planted["test"]),
                     "--predictions_out", str(out))
    assert ran.returncode == 0, ran.stderr
    table = np.loadtxt(out, dtype=np.float32)
    files = sorted(p for p in planted["test"].iterdir() if p.name.startswith("part-"))
    assert len(files) == 1
    line = next(x for x in ran.stdout.splitlines() if x.startswith("infer: "))
    return {"save": save, "labels": table[:, 0], "predictions": table[:, 1], "file": files[0],
            "line": line}


def test_evaluate_is_mode_infer(trained: dict[str, Any], infer: dict[str, Any]) -> None:
    got = gpubox.evaluate(trained["config"], infer["save"], predictions=True)
    auc = float(infer["line"].split("auc: ")[1].split(",")[0])
    assert round(got.metrics.auc, 6) == auc
    # The same computation: --predictions_out reads back to the very floats it computed.
    assert got.predictions.dtype == np.float32 and len(got.predictions) == 5000
    np.testing.assert_array_equal(got.labels, infer["labels"])
    np.testing.assert_array_equal(got.predictions, infer["predictions"])


def test_predict_from_slot_text_equals_infer(trained: dict[str, Any], infer: dict[str, Any]) -> None:
    model = gpubox.load(infer["save"], trained["config"])
    got = model.predict(infer["file"].read_text())
    assert got.dtype == np.float32 and got.shape == infer["predictions"].shape
    np.testing.assert_allclose(got, infer["predictions"], rtol=1e-5, atol=1e-6)


def test_predict_from_columns_and_dataframe_equals_infer(trained: dict[str, Any],
                                                         infer: dict[str, Any]) -> None:
    model = gpubox.load(infer["save"], trained["config"])
    assert model.slot_names == [str(s) for s in range(1, 9)]
    columns = read_slot_text(infer["file"])
    np.testing.assert_array_equal(np.asarray(columns["click"], np.float32), infer["labels"])
    np.testing.assert_allclose(model.predict(columns), infer["predictions"], rtol=1e-5, atol=1e-6)
    # One id per row: plain integer columns; dense as an n x 3 array.
    single = {s: [ids[0] for ids in columns[s]] for s in model.slot_names}
    if all(len(ids) == 1 for s in model.slot_names for ids in columns[s]):
        dense = np.asarray(columns["dense_feature"], np.float32)
        np.testing.assert_allclose(model.predict(single, dense=dense), infer["predictions"],
                                   rtol=1e-5, atol=1e-6)
    pandas = pytest.importorskip("pandas")
    frame = pandas.DataFrame(columns)
    np.testing.assert_allclose(model.predict(frame), infer["predictions"], rtol=1e-5, atol=1e-6)


def test_an_export_predicts_as_the_save(trained: dict[str, Any], infer: dict[str, Any]) -> None:
    export = trained["out"] / "export"
    ran = run_binary("gpubox_train", "--config", str(CONFIG), *dash_o(trained["config"]),
                     "--mode", "export", "--load", str(infer["save"]), "--out", str(export))
    assert ran.returncode == 0, ran.stderr
    model = gpubox.load(export)  # what gpubox_serve loads; no config needed
    with pytest.warns(UserWarning, match="is an export: it carries its network and rules; the "
                      "config given is not used"):
        gpubox.load(export, trained["config"])
    # A mistyped folder fails, naming it, and warns nothing about the config.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(Exception, match="export-typo"):
            gpubox.load(trained["out"] / "export-typo", trained["config"])
    np.testing.assert_allclose(model.predict(infer["file"].read_text()), infer["predictions"],
                               rtol=1e-5, atol=1e-6)


def test_predictions_per_line_stop_at_a_line_they_would_skip(trained: dict[str, Any],
                                                              infer: dict[str, Any],
                                                              tmp_path: pathlib.Path) -> None:
    lines = infer["file"].read_text().splitlines()
    blank = tmp_path / "blank"
    blank.mkdir()
    (blank / "part-00000").write_text("\n".join(lines[:3] + ["  "] + lines[3:]) + "\n")
    with pytest.raises(gpubox.EngineError, match=r"part-00000:4: blank line \(predictions=True"):
        gpubox.evaluate(trained["config"], infer["save"], blank, predictions=True)
    # Without predictions the line is skipped and counted, as before.
    assert gpubox.evaluate(trained["config"], infer["save"], blank).metrics.examples == len(lines)


def test_bad_input_is_refused(trained: dict[str, Any], infer: dict[str, Any]) -> None:
    model = gpubox.load(infer["save"], trained["config"])
    with pytest.raises(gpubox.EngineError, match="unknown slot|'99'"):
        model.predict("click:1 dense_feature:0.1 dense_feature:0.2 dense_feature:0.3 99:5")
    with pytest.raises(ValueError, match="dense"):
        model.predict({"1": [3, 4]})
    # Dense values that are no finite float32: refused as gpubox_serve refuses them (400).
    for bad in (float("nan"), float("-inf"), 1e300):
        with pytest.raises(ValueError, match="not a finite number"):
            model.predict({"1": [3, 4]}, dense=[[0.1, 0.2, 0.3], [bad, 0.0, 0.0]])
    with pytest.raises(ValueError, match="none of the model's"):
        model.predict({1: [3, 4]}, dense=[[0.1, 0.2, 0.3], [0.0, 0.0, 0.0]])
    # Dense values as text (the server refuses them), or given twice (one was ignored).
    with pytest.raises(TypeError, match="'dense_feature': dense values must be numbers"):
        model.predict({"1": [3, 4], "dense_feature": [["0.1", "0.2", "0.3"]] * 2})
    with pytest.raises(ValueError, match="'dense_feature': rows of unequal length"):
        model.predict({"1": [3, 4], "dense_feature": [[0.1, 0.2, 0.3], [0.1]]})
    with pytest.raises(ValueError, match="dense values given twice"):
        model.predict({"1": [3], "dense_feature": [[0.1, 0.2, 0.3]]}, dense=[[0.1, 0.2, 0.3]])
    # An id array of another length than the rows: named (the engine said "offsets must rise").
    with pytest.raises(ValueError, match="slot 2: 2 rows, the first column has 3"):
        model.predict({"1": [3, 4, 5], "2": np.array([3, 4])}, dense=[[0.1, 0.2, 0.3]] * 3)
    # No rows: no prediction (and no data set to train).
    assert model.predict({"1": [], "dense_feature": []}).shape == (0,)
    with pytest.raises(ValueError, match="no rows"):
        gpubox.Dataset.from_frame({"click": [], "1": [], "dense_feature": []}, trained["config"])
    with pytest.raises(ValueError, match="config"):
        gpubox.load(infer["save"])
    # A list of lines is one prediction per element: an element of two lines (three predictions
    # for two elements) is refused; an element's own line end is taken.
    lines = infer["file"].read_text().splitlines()[:3]
    with pytest.raises(ValueError, match="element 0 of the list is several lines"):
        model.predict([lines[0] + "\n" + lines[1], lines[2]])
    assert model.predict([lines[0] + "\n", lines[1]]).shape == (2,)


def test_precision_is_the_trained_one_unless_asked(trained: dict[str, Any],
                                                   infer: dict[str, Any]) -> None:
    out = trained["out"] / "export_precision"
    done = gpubox._core.export_save(trained["config"]._loaded, str(infer["save"]), str(out))
    assert done["dense_precision"] == "fp32" and done["rows_exported"] > 0
    model = gpubox.load(out)
    assert (model.trained_precision, model.precision) == ("fp32", "fp32")
    text = infer["file"].read_text()
    fp32 = model.predict(text)
    np.testing.assert_array_equal(gpubox.load(out, precision="fp32").predict(text), fp32)
    bf16 = gpubox.load(out, precision="bf16")
    assert bf16.trained_precision == "fp32"
    assert bf16.precision in ("bf16", "fp32")  # fp32 where the CPU has no bf16 GEMMs
    got = bf16.predict(text)
    if bf16.precision == "bf16":
        # Rounding the activations moves most predictions, a little.
        assert np.count_nonzero(got != fp32) > len(got) // 10
        np.testing.assert_allclose(got, fp32, atol=2e-2)
    else:
        np.testing.assert_array_equal(got, fp32)
    # A save is exported in memory first: the argument reaches it too.
    from_save = gpubox.load(infer["save"], trained["config"], precision="bf16")
    assert from_save.precision == bf16.precision
    with pytest.raises(gpubox.ConfigError,
                       match=r"precision: expected one of fp32\|bf16, got 'fp8'"):
        gpubox.load(out, precision="fp8")


def test_threads_predicting_on_one_model_get_what_one_thread_gets(trained: dict[str, Any],
                                                                  infer: dict[str, Any]) -> None:
    model = gpubox.load(infer["save"], trained["config"])
    text = infer["file"].read_text()
    columns = read_slot_text(infer["file"])
    want_text, want_columns = model.predict(text), model.predict(columns)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(model.predict, text if i % 2 else columns) for i in range(8)]
        for i, future in enumerate(futures):
            np.testing.assert_array_equal(future.result(), want_text if i % 2 else want_columns)



def test_the_dense_transform_trained_applies_to_columns_as_to_text(planted: dict[str, Any],
                                                                   tmp_path: pathlib.Path) -> None:
    """A model trained on log(x + 1) of its files' dense values predicts columns through the
    transform as slot text (and gpubox_serve) do; a data set in memory under a config naming the
    transform is refused (its values would be taken as given)."""
    config = planted_config(planted, tmp_path, **{"runner.epochs": 1,
                                                  "runner.train_data_dir": planted["test"],
                                                  "runner.dense_transform": "log1p"})
    gpubox.train(config)
    model = gpubox.load(tmp_path / "model" / "0", config)
    (part,) = [p for p in planted["test"].iterdir() if p.name.startswith("part-")]
    columns = read_slot_text(part)
    from_text = model.predict(part.read_text())
    np.testing.assert_allclose(model.predict(columns), from_text, rtol=1e-6, atol=1e-7)
    data = gpubox.Dataset.from_frame(columns, config)
    with pytest.raises(gpubox.EngineError, match="is held in memory"):
        gpubox.train(config, train_data=data)
