"""gpubox.data.Dataset: a DataFrame trains and evaluates exactly as the same rows in a file."""

from __future__ import annotations

import collections
import json
import pathlib
from typing import Any

import numpy as np
import pytest
from conftest import CONFIG, planted_config, read_slot_text, run_binary

import gpubox


def test_a_dataframe_trains_bit_for_bit_as_its_file(planted: dict[str, Any],
                                                    tmp_path: pathlib.Path) -> None:
    pandas = pytest.importorskip("pandas")
    small = {"runner.epochs": 2, "runner.train_data_dir": planted["test"],
             "runner.test_data_dir": planted["test"], "runner.model_save_path": "",
             "runner.metrics_path": ""}
    config = planted_config(planted, tmp_path, **small)
    from_file = gpubox.train(config)
    (part,) = [p for p in planted["test"].iterdir() if p.name.startswith("part-")]
    frame = pandas.DataFrame(read_slot_text(part))
    data = gpubox.Dataset.from_frame(frame, config)
    assert len(data) == 5000
    from_frame = gpubox.train(config, train_data=data, test_data=data)
    for got, want in zip(from_frame.passes, from_file.passes):
        assert got.metrics == want.metrics  # every metric, exactly
    assert [e.test for e in from_frame.epochs] == [e.test for e in from_file.epochs]
    assert len(from_frame.passes) == 2 and from_frame.epochs[-1].test is not None


def test_a_dataset_released_during_training_is_read_to_the_runs_end(
        planted: dict[str, Any], trained: dict[str, Any], tmp_path: pathlib.Path) -> None:
    """Dataset.release keeps a run's copy: the run reads every pass (it failed at the first pass
    read after the release), and the name is gone once the run ends."""
    config = planted_config(planted, tmp_path, **{
        "runner.epochs": 3, "runner.train_data_dir": planted["test"], "runner.test_data_dir": "",
        "runner.model_save_path": "", "runner.metrics_path": ""})
    (part,) = [p for p in planted["test"].iterdir() if p.name.startswith("part-")]
    data = gpubox.Dataset.from_frame(read_slot_text(part), config)
    name = data.name

    def release_at_pass_0(p: gpubox.PassMetrics) -> None:
        if p.pass_id == 0:
            data.release()

    result = gpubox.train(config, release_at_pass_0, train_data=data)
    assert [p.metrics.examples for p in result.passes] == [5000, 5000, 5000]
    with pytest.raises(gpubox.EngineError, match="not registered"):
        gpubox.evaluate(trained["config"], trained["out"] / "model" / "2", name)


def test_evaluate_a_dataframe(trained: dict[str, Any], planted: dict[str, Any]) -> None:
    config: gpubox.Config = trained["config"]
    save = trained["out"] / "model" / "2"
    (part,) = [p for p in planted["test"].iterdir() if p.name.startswith("part-")]
    data = gpubox.Dataset.from_frame(read_slot_text(part), config)
    got = gpubox.evaluate(config, save, data, predictions=True)
    want = gpubox.evaluate(config, save, planted["test"], predictions=True)
    assert got.metrics == want.metrics
    np.testing.assert_array_equal(got.predictions, want.predictions)
    data.release()
    with pytest.raises(gpubox.EngineError, match="not registered"):
        gpubox.evaluate(config, save, "memory:999999")


def test_columns_that_do_not_fit_are_refused(trained: dict[str, Any]) -> None:
    config: gpubox.Config = trained["config"]
    with pytest.raises(ValueError, match="label"):
        gpubox.Dataset.from_frame({"1": [5], "dense_feature": [[0.1, 0.2, 0.3]]}, config)
    with pytest.raises(ValueError, match="dense"):
        gpubox.Dataset.from_frame({"click": [1], "1": [5]}, config)
    dense = [[0.1, 0.2, 0.3], [0.0, 0.0, 1.0]]
    # Missing ids as NaN (pandas' float columns), negative ids and stray floats are not keys.
    for bad in ([5.0, float("nan")], [5, -1], [[7, 8.5], []], [[7], float("nan")]):
        with pytest.raises(ValueError, match="slot 1"):
            gpubox.Dataset.from_frame({"click": [1, 0], "1": bad, "dense_feature": dense}, config)
    data = gpubox.Dataset.from_frame(
        {"click": [1, 0], "1": [5, 0], "3": [[7, 8], []],
         "dense_feature": [[0.1, 0.2, 0.3], [0.0, 0.0, 1.0]]}, config)
    assert len(data) == 2


def test_stat_counts_as_gpubox_data_stat(trained: dict[str, Any], planted: dict[str, Any]) -> None:
    config: gpubox.Config = trained["config"]
    ran = run_binary("gpubox_data", "stat", "--config", str(CONFIG),
                     *[a for o in config.overrides for a in ("-o", o)], "--json")
    assert ran.returncode == 0, ran.stderr
    want = json.loads(ran.stdout)
    got = gpubox.data.stat(config)
    keys = ["files", "lines", "instances", "skipped_lines", "unique_keys", "positives", "bytes"]
    assert {k: got[k] for k in keys} == {k: want[k] for k in keys}
    (part,) = [p for p in planted["test"].iterdir() if p.name.startswith("part-")]
    from_frame = gpubox.data.stat(config, [gpubox.Dataset.from_frame(read_slot_text(part),
                                                                     config)])
    from_file = gpubox.data.stat(config, [planted["test"]])
    for k in ["instances", "unique_keys", "positives", "unique_keys_per_slot"]:
        assert from_frame[k] == from_file[k], k


def test_a_streamed_reader_refuses_a_dataset_naming_the_key(planted: dict[str, Any],
                                                            tmp_path: pathlib.Path) -> None:
    config = planted_config(planted, tmp_path, **{"runner.reader_type": "QueueDataset",
                                                  "runner.shuffle": False,
                                                  "runner.test_data_dir": ""})
    (part,) = [p for p in planted["test"].iterdir() if p.name.startswith("part-")]
    data = gpubox.Dataset.from_frame(read_slot_text(part), config)
    with pytest.raises(gpubox.EngineError,
                       match="runner.reader_type: QueueDataset streams data files.*"
                             "runner.reader_type: InmemoryDataset"):
        gpubox.train(config, train_data=data)
    assert not (tmp_path / "model").exists()  # refused before any pass


def test_a_frame_that_names_no_slot_or_holds_other_labels_is_refused(
        trained: dict[str, Any]) -> None:
    config: gpubox.Config = trained["config"]
    dense = [[0.1, 0.2, 0.3], [0.0, 0.0, 1.0]]
    # Columns named by numbers (a frame read without a header): every instance would have no id.
    numbered = {"click": [1, 0], 1: [5, 6], 2: [7, 8], "dense_feature": dense}
    with pytest.raises(ValueError, match=r"none of the model's 8 slots .*astype\(str\)"):
        gpubox.Dataset.from_frame(numbered, config)
    # A slot without a column is a slot without ids; beside a column nobody reads, it is said.
    with pytest.warns(UserWarning, match=r"7 slots have no column.*'slot1'.* not read"):
        gpubox.Dataset.from_frame({"click": [1, 0], "slot1": [5, 6], "2": [7, 8],
                                   "dense_feature": dense}, config)
    # Labels are 0 or 1, as the files' bad_label: the row is named.
    for labels, shown in (([1, 2], "2"), ([-1, 0], "-1"), ([0.7, 1.0], "0.7"),
                          ([1.0, float("nan")], "nan")):
        with pytest.raises(ValueError, match=rf"label column 'click': row \d holds {shown}"):
            gpubox.Dataset.from_frame({"click": labels, "1": [5, 6], "dense_feature": dense},
                                      config)
    with pytest.raises(ValueError, match="labels are the numbers 0 and 1, got dtype"):
        gpubox.Dataset.from_frame({"click": ["1", "0"], "1": [5, 6], "dense_feature": dense},
                                  config)
    for labels in ([True, False], [1.0, 0.0], np.array([1, 0], dtype=np.int8)):
        assert len(gpubox.Dataset.from_frame({"click": labels, "1": [5, 6],
                                              "dense_feature": dense}, config)) == 2
    # Dense values that are no finite float32 (NaN, inf, 1e300) name the row and the value.
    for bad in (float("nan"), float("inf"), 1e300):
        with pytest.raises(ValueError, match="'dense_feature': row 1, value 2 is .*not a finite"):
            gpubox.Dataset.from_frame({"click": [1, 0], "1": [5, 6],
                                       "dense_feature": [[0.1, 0.2, 0.3], [0.0, 0.0, bad]]},
                                      config)


def test_a_dataset_built_under_other_slots_is_refused(trained: dict[str, Any],
                                                      planted: dict[str, Any]) -> None:
    config: gpubox.Config = trained["config"]
    (part,) = [p for p in planted["test"].iterdir() if p.name.startswith("part-")]
    data = gpubox.Dataset.from_frame(read_slot_text(part), config)
    reversed_slots = gpubox.Config.from_yaml(
        config.path, override_list=[*config.overrides,
                                    "hyper_parameters.slot_names=[8, 7, 6, 5, 4, 3, 2, 1]",
                                    "runner.model_save_path=", "runner.metrics_path=",
                                    "runner.test_data_dir="])
    with pytest.raises(gpubox.EngineError,
                       match="built under other slots: slot 1 is '1' there, '8' in the config"):
        gpubox.train(reversed_slots, train_data=data)
    with pytest.raises(gpubox.EngineError, match="built under other slots"):
        gpubox.data.stat(reversed_slots, [data])


def test_an_override_of_none_is_refused(trained: dict[str, Any]) -> None:
    config: gpubox.Config = trained["config"]
    with pytest.raises(gpubox.ConfigError, match="runner.model_save_path: None is not a value"):
        gpubox.Config.from_yaml(config.path, {"runner.model_save_path": None})


def test_values_that_read_as_other_data_are_refused(trained: dict[str, Any],
                                                    planted: dict[str, Any],
                                                    tmp_path: pathlib.Path) -> None:
    """Inputs read as something else than given (a helper's probe): each is refused, naming it."""
    pd = pytest.importorskip("pandas")
    config: gpubox.Config = trained["config"]
    dense = [[0.1, 0.2, 0.3], [0.0, 0.0, 1.0]]
    # Labels are checked before the float32 cast (0.99999999 and 1e-60 became 1 and 0).
    for labels, shown in (([0.99999999, 0.0], "0.99999999"), ([1.0, 1e-60], "1e-60")):
        with pytest.raises(ValueError, match=rf"label column 'click': row \d holds {shown}"):
            gpubox.Dataset.from_frame({"click": labels, "1": [5, 6], "dense_feature": dense},
                                      config)
    # Two columns of one slot name were merged into two ids a row.
    twice = pd.concat([pd.DataFrame({"click": [1, 0], "1": [5, 6]}),
                       pd.DataFrame({"1": [7, 8], "dense_feature": dense})], axis=1)
    with pytest.raises(ValueError, match="slot 1: the frame has 2 columns named '1'"):
        gpubox.Dataset.from_frame(twice, config)
    # Rows that len() and iteration take but are no ids: True was id 1, b"17" ids 49 and 55.
    for row in (True, b"17", {5: "x"}, np.bool_(True)):
        with pytest.raises(ValueError, match="slot 1: row 0 holds"):
            gpubox.Dataset.from_frame({"click": [1, 0], "1": [row, 6], "dense_feature": dense},
                                      config)
    # Errors that named no row: pandas' NA, an id past 2^64, a dense row of another width.
    with pytest.raises(ValueError, match="slot 1: row 1 holds <NA>"):
        gpubox.Dataset.from_frame({"click": [1, 0], "1": pd.array([5, None], dtype="Int64"),
                                   "dense_feature": dense}, config)
    # The same nullable column without NA is its ids (newer pandas gives it as int64, older as
    # objects).
    # Two ids the model learned (slot 1's most frequent in a training file), so that the
    # predictions tell them apart (swapped, they differ).
    part = sorted(p for p in planted["train"].iterdir() if p.name.startswith("part-"))[0]
    counts = collections.Counter(i for ids in read_slot_text(part)["1"] for i in ids)
    learned = [i for i, _ in counts.most_common(2)]
    assert len(learned) == 2
    save = trained["out"] / "model" / "2"

    def predict(ids: Any) -> np.ndarray:
        data = gpubox.Dataset.from_frame({"click": [1, 0], "1": ids, "dense_feature": dense},
                                         config)
        return gpubox.evaluate(config, save, data, predictions=True).predictions

    want = predict(learned)
    assert not np.array_equal(predict(learned[::-1]), want)
    for dtype in ("Int64", "UInt32"):
        np.testing.assert_array_equal(predict(pd.array(learned, dtype=dtype)), want)
    with pytest.raises(ValueError, match=r"ids must be integers in \[0, 2\^64\), got 1844"):
        gpubox.Dataset.from_frame({"click": [1, 0], "1": [[5], [2**64 + 1]],
                                   "dense_feature": dense}, config)
    with pytest.raises(ValueError, match=r"rows of unequal length \(row 1 holds \[0.1\]\)"):
        gpubox.Dataset.from_frame({"click": [1, 0], "1": [5, 6],
                                   "dense_feature": [[0.1, 0.2, 0.3], [0.1]]}, config)
    with pytest.raises(ValueError, match=r"slot 1: ids must be integers >= 0, got True"):
        gpubox.Dataset.from_frame({"click": [1, 0], "1": [[True], [6]], "dense_feature": dense},
                                  config)
    # Series of other indexes were paired by position, each row with another's values.
    shuffled = pd.Series([5, 6], index=[1, 0])
    with pytest.raises(ValueError, match="the columns' pandas indexes differ"):
        gpubox.Dataset.from_frame({"click": pd.Series([1, 0]), "1": shuffled,
                                   "dense_feature": pd.Series(dense)}, config)
    frame = pd.DataFrame({"click": [1, 0], "1": [5, 6]})
    with pytest.raises(ValueError, match="the columns' pandas indexes differ"):
        gpubox.Dataset.from_frame(frame, config, dense=pd.DataFrame(dense, index=[7, 8]))
    assert len(gpubox.Dataset.from_frame(frame, config, dense=pd.DataFrame(dense))) == 2
    # A list override's strings stay whole (a path holding ", " was two paths); bytes refused.
    folder = tmp_path / "t, d"
    loaded = gpubox.Config.from_yaml(CONFIG, {"runner.test_data_dir": [str(folder)]})
    assert loaded.test_data_dir == str(folder)
    with pytest.raises(TypeError, match="not bytes"):
        gpubox.Config.from_yaml(CONFIG, {"runner.train_data_dir": b"/data"})
