#!/usr/bin/env python3
"""python3 tests/scripts/bench_table_test.py REPO

scripts/bench_table.py against hand-computed oracles: BENCHMARKS.md's table is what
docs/bench/current.json renders (the staleness check), the ratios are the values' ratios, every
figure's section is a heading of BENCHMARKS.md, --check fails on a stale copy, and `ingest` takes
the figures from bench_gpubox.sh's and bench_scale.sh's results.json (small hand-written ones
here) and from what scripts/peer/report.py and report_ps.py write with --json (run here on
hand-made metrics), and leaves the others alone. Standard library only."""
import copy
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stderr

REPO = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_test_util import load_script, read, run_main, write  # noqa: E402

bt = load_script(REPO, "bench_table")


def run(argv):
    return run_main(bt.main, argv)


def figure(**kw):
    f = {"id": "x", "figure": "f", "value": 1.0, "limit": "l", "command": "c",
         "date": "2026-01-01", "machine": "m"}
    f.update(kw)
    return f


def gpubox_results(path_config="/r/configs/config_gpubox.yaml"):
    """The parts of bench_gpubox.sh's results.json that bench_table.py reads."""
    return {
        "command": "scripts/bench_gpubox.sh --cards 1,2 --components", "date_utc": "2026-12-01T10:00:00Z",
        "commit": "abc", "machine": {"cpu_model": "Test CPU", "cores": "2"},
        "config": {"path": path_config},
        "summary": [{"cards": 1, "ips_median": 1000.0, "loadavg_median": 1.5},
                    {"cards": 2, "ips_median": 1800.0, "loadavg_median": 2.5}],
        "component_table": [],
        "components": {
            "dense_2": {"cards": 2, "examples_per_sec": 5000.0, "flop_limit_examples_per_sec": 6000.0},
            "hashtable": {"absl_flat_hash_map": {"find_hit_mops": 4.0},
                          "card_table": [{"threads": 1, "find_hit_mops": 10.0},
                                         {"threads": 2, "find_hit_mops": 12.0}]},
            "server": {"pull": {"rows_per_s": 2e6}, "table_pull": {"rows_per_s": 8e6}},
            "dataset": {"threads": [{"threads": 2, "mb_per_s": 300.0}], "cat_mb_per_s": 3000.0},
        },
    }


def scale_results(runs, extra=""):
    return {"meta": {"commit": "def", "extra_overrides": extra, "load_average_at_end": "1.0",
                     "date_utc": "2026-12-02T00:00:00Z", "command": "scripts/bench_scale.sh " + extra},
            "runs": runs}


def scale_run(vocab, ips, visible):
    return {"vocab": vocab, "examples_per_s_after_pass0": ips, "visible_begin_s": visible}


class Render(unittest.TestCase):
    def test_ratios_are_the_values_ratios(self):
        self.assertEqual(bt.ratio_text(figure(value=30453, limit_value=14809)), "2.06×")
        self.assertEqual(bt.ratio_text(figure(value=54033, limit_value=112034, ratio="fraction")), "0.48")
        self.assertEqual(bt.ratio_text(figure(value=18012, limit_value=27272, ratio="percent")), "66%")
        self.assertEqual(bt.ratio_text(figure(value=5.2, limit_value=110.2, ratio="percent")), "4.7%")
        self.assertEqual(bt.ratio_text(figure(value=0.7816, limit_value=0.7682, ratio="difference",
                                              digits=4)), "+0.0134")
        self.assertEqual(bt.ratio_text(figure(ratio="none", ratio_text="met")), "met")

    def test_anchor_is_githubs(self):
        self.assertEqual(bt.slug("Training end to end (`gpubox_train`)"), "training-end-to-end-gpubox_train")
        self.assertEqual(bt.slug("10^8 after the step: the ≥ 50% aim"), "108-after-the-step-the--50-aim")

    def test_a_row_shows_value_limit_and_where(self):
        cur = {"machines": {"vm": "a VM"},
               "figures": [figure(value=1234.4, unit="ex/s", limit_value=2469, machine="vm",
                                  load="load 2", section="S x")]}
        row = bt.render(cur).splitlines()[2]
        self.assertEqual(row, "| f ([more](#s-x)) | 1,234 ex/s | l: 2,469 ex/s | 0.50× | — | `c` | "
                              "2026-01-01, vm (load 2) |")


class Shipped(unittest.TestCase):
    def test_benchmarks_md_table_is_current(self):
        rc, out, err = run(["--check"])
        self.assertEqual(rc, 0, err + "\nregenerate with: scripts/bench_table.py --write")

    def test_every_figure_has_its_history_section(self):
        cur = bt.load_current(bt.CURRENT)
        text = read(bt.BENCHMARKS)
        self.assertEqual(bt.check_sections(cur, text, bt.BENCHMARKS), [])
        self.assertTrue(all(f.get("section") for f in cur["figures"]))

    def test_the_table_opens_the_file(self):
        text = read(bt.BENCHMARKS)
        self.assertLess(text.index(bt.BEGIN), text.index("\n## "), "the table is not above the first section")

    def test_check_fails_on_a_stale_copy(self):
        text = read(bt.BENCHMARKS)
        # The table's first ratio cell, whatever the shipped figures are, made stale.
        cell = re.search(r"\| [0-9]+\.[0-9]+× \|", text[text.index(bt.BEGIN):])
        self.assertIsNotNone(cell, "no ratio cell in the shipped table")
        with tempfile.TemporaryDirectory() as d:
            stale = os.path.join(d, "B.md")
            write(stale, text.replace(cell.group(0), "| 0.01× |", 1))
            rc, _, err = run(["--check", "--benchmarks", stale])
            self.assertEqual(rc, 1)
            self.assertIn("bench_table.py --write", err)


class Ingest(unittest.TestCase):
    def setUp(self):
        self.cur = bt.load_current(bt.CURRENT)
        self.d = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.d.cleanup()

    def write(self, name, obj):
        p = os.path.join(self.d.name, name)
        write(p, json.dumps(obj))
        return p

    def by_id(self, cur):
        return {f["id"]: f for f in cur["figures"]}

    def test_bench_gpubox_results(self):
        before = copy.deepcopy(self.cur)
        updated = bt.ingest(self.cur, [self.write("g.json", gpubox_results())], "dev VM")
        self.assertEqual(sorted(updated), ["data-loading", "hashtable", "server-pull", "train-2cards"])
        f = self.by_id(self.cur)
        self.assertEqual((f["train-2cards"]["value"], f["train-2cards"]["limit_value"]), (1800.0, 6000.0))
        self.assertEqual((f["hashtable"]["value"], f["hashtable"]["limit_value"]), (10.0, 4.0))
        self.assertEqual((f["server-pull"]["value"], f["server-pull"]["limit_value"]), (2.0, 8.0))
        self.assertEqual((f["data-loading"]["value"], f["data-loading"]["limit_value"]), (300.0, 3000.0))
        self.assertEqual(f["train-2cards"]["date"], "2026-12-01")
        self.assertEqual(f["train-2cards"]["command"], "scripts/bench_gpubox.sh --cards 1,2 --components")
        self.assertEqual(f["train-2cards"]["load"], "load 1.5–2.5")
        old = self.by_id(before)
        for k in f:
            if k not in updated:
                self.assertEqual(f[k], old[k], k)

    def test_another_config_does_not_replace_the_training_figure(self):
        updated = bt.ingest(self.cur, [self.write("g.json", gpubox_results("/r/configs/config_synthetic.yaml"))],
                            "dev VM")
        self.assertNotIn("train-2cards", updated)
        self.assertIn("hashtable", updated)

    def test_bench_scale_results_on_and_off(self):
        on = scale_results([scale_run(10**6, 30000.0, [0.1, 0, 0, 0]),
                            scale_run(10**8, 21000.0, [6.0, 0.5, 1.0, 2.0, 0.5])])
        off = scale_results([scale_run(10**8, 20000.0, [6.0, 6.0, 10.0, 20.0, 10.0])],
                            extra="-o runner.prefetch_passes=0")
        updated = bt.ingest(self.cur, [self.write("off.json", off), self.write("on.json", on)], "dev VM")
        self.assertEqual(sorted(updated), ["scale-1e8", "scale-boundary"])
        f = self.by_id(self.cur)
        self.assertEqual((f["scale-1e8"]["value"], f["scale-1e8"]["limit_value"]), (21000.0, 30000.0))
        self.assertEqual((f["scale-boundary"]["value"], f["scale-boundary"]["limit_value"]), (3.5, 40.0))
        self.assertEqual(f["scale-1e8"]["date"], "2026-12-02")
        self.assertEqual(bt.ratio_text(f["scale-1e8"]), "70%")

    def peer_json(self, *extra):
        """scripts/peer/report.py run on two epochs of hand-made metrics: its --json."""
        gb = [{"pass": p, "cards": 2, "examples": 1000, "begin_pass_seconds": 0.1,
               "train_seconds": 0.8, "end_pass_seconds": 0.1, "auc": 0.8} for p in (0, 1)]
        pd = {"paddle_version": "2.6.2", "threads": 2, "batch": 512,
              "epochs": [{"epoch": e, "examples": 1000, "train_seconds": 2.5, "ips": 400.0,
                          "auc": 0.78, "test_auc": t} for e, t in ((1, 0.77), (2, 0.765))]}
        oracle = {"lines": 1000, "auc": 0.88}
        m, p, o = (self.write(n, x) for n, x in (("m.jsonl", None), ("p.json", pd), ("o.json", oracle)))
        write(m, "".join(json.dumps(x) + "\n" for x in gb))
        out = os.path.join(self.d.name, "report_fp32.json")
        subprocess.run([sys.executable, os.path.join(REPO, "scripts", "peer", "report.py"),
                        "--gpubox_metrics", m, "--gpubox_test_auc", "0.78,0.781", "--paddle_json", p,
                        "--oracle", o, "--timed_epoch", "2", "--out", os.path.join(self.d.name, "r.md"),
                        "--meta", "command: scripts/bench_peer_paddle.sh --epochs 2", "--json", out,
                        "--precision", "fp32", "--load", "1.0 / 2.0", *extra],
                       check=True, stdout=subprocess.DEVNULL)
        return out

    def test_peer_report_names_gpuboxs_batch(self):
        """GPUBox's batch per card is Paddle's per thread unless --gpubox_batch says otherwise
        (bench_peer_paddle.sh --gpubox-batch: the comparison at equal steps)."""
        for extra, batch in (((), 512), (("--gpubox_batch", "256"), 256)):
            self.peer_json(*extra)
            with open(os.path.join(self.d.name, "r.md")) as f:
                row = next(line for line in f if line.startswith("| GPUBox |"))
            self.assertIn("batch %d per card" % batch, row)

    def ps_json(self, extra_rows=()):
        """scripts/peer/report_ps.py run on hand-made job folders: its --json."""
        rows = list(extra_rows)
        for system, sched, ips_secs in (("gpubox", "async", 0.5), ("paddle", "async", 2.0),
                                        ("gpubox", "geo", 0.25), ("paddle", "geo", 4.0)):
            folder = os.path.join(self.d.name, system + sched)
            os.mkdir(folder)
            if system == "gpubox":
                write(os.path.join(folder, "metrics.jsonl"), "".join(json.dumps(x) + "\n" for x in (
                    {"pass": 0, "examples": 500, "train_seconds": ips_secs, "auc": 0.7},
                    {"epoch": 0, "test_auc": 0.77})))
            else:
                write(os.path.join(folder, "paddle.worker0.json"), json.dumps({"epochs": [
                    {"examples": 500, "train_seconds": ips_secs, "auc": 0.8, "wire_bytes": 1,
                     "test_auc": 0.6}]}))
            rows.append("\t".join((system, sched, "3.5 3.0 2.0", folder)))
        runs = os.path.join(self.d.name, "runs.tsv")
        write(runs, "\n".join(rows) + "\n")
        out = os.path.join(self.d.name, "report_ps.json")
        subprocess.run([sys.executable, os.path.join(REPO, "scripts", "peer", "report_ps.py"),
                        "--runs", runs, "--epochs", "1", "--oracle", self.write("o2.json", {"lines": 1, "auc": 0.9}),
                        "--out", os.path.join(self.d.name, "ps.md"), "--json", out,
                        "--meta", "command: scripts/bench_peer_paddle.sh --mode ps"],
                       check=True, stdout=subprocess.DEVNULL)
        return out

    def test_bench_peer_paddle_reports(self):
        updated = bt.ingest(self.cur, [self.peer_json(), self.ps_json()], "dev VM")
        self.assertEqual(sorted(updated), ["peer-paddle-async", "peer-paddle-geo", "peer-paddle-gpubox",
                                           "quality-vs-paddle"])
        f = self.by_id(self.cur)
        # GPUBox: 1000 examples in 0.1 + 0.8 + 0.1 s; Paddle: its ips.
        self.assertAlmostEqual(f["peer-paddle-gpubox"]["value"], 1000.0)
        self.assertEqual(f["peer-paddle-gpubox"]["limit_value"], 400.0)
        self.assertEqual(f["peer-paddle-gpubox"]["load"], "load 1.0 / 2.0")
        self.assertEqual(f["peer-paddle-gpubox"]["command"], "scripts/bench_peer_paddle.sh --epochs 2")
        self.assertEqual((f["quality-vs-paddle"]["value"], f["quality-vs-paddle"]["limit_value"]),
                         (0.781, 0.765))
        self.assertEqual((f["peer-paddle-async"]["value"], f["peer-paddle-async"]["limit_value"]),
                         (1000.0, 250.0))
        self.assertEqual((f["peer-paddle-geo"]["value"], f["peer-paddle-geo"]["limit_value"]),
                         (2000.0, 125.0))
        self.assertEqual(f["peer-paddle-geo"]["detail"], "held-out AUC 0.7700 vs 0.6000")
        self.assertEqual(f["peer-paddle-geo"]["load"], "load 3.5 / 3.5")
        self.assertEqual(bt.ratio_text(f["peer-paddle-geo"]), "16.00×")

    def test_a_failed_paddle_run_is_a_row_not_a_figure(self):
        """A Paddle PS run that wrote no result (2.6.2's sync mode crashes) is a table row naming
        why; its mode gives no figure to ingest, and the other modes still do."""
        folder = os.path.join(self.d.name, "gpuboxsync")
        os.mkdir(folder)
        write(os.path.join(folder, "metrics.jsonl"), json.dumps(
            {"pass": 0, "examples": 500, "train_seconds": 0.5, "auc": 0.7}) + "\n")
        out = self.ps_json((
            "\t".join(("gpubox", "sync", "1.0 1.0 1.0", folder)),
            "\t".join(("paddle", "sync", "1.5 1.0 1.0", os.path.join(self.d.name, "none"),
                       "worker 0 wrote no result (launcher exit 0): FatalError: `Segmentation fault`"))))
        with open(os.path.join(self.d.name, "ps.md")) as f:
            md = f.read()
        self.assertIn("| sync | GPUBox | 1.0 1.0 1.0 | 1000 |", md)
        self.assertIn("| sync | Paddle | failed: worker 0 wrote no result (launcher exit 0): FatalError: "
                      "`Segmentation fault` (load 1.5 1.0 1.0) |", md)
        with open(out) as f:
            self.assertEqual(sorted(json.load(f)["modes"]), ["async", "geo"])

    def test_a_missing_base_size_updates_nothing(self):
        on = scale_results([scale_run(10**8, 21000.0, [6.0, 0.5, 1.0])])
        self.assertEqual(bt.ingest(self.cur, [self.write("on.json", on)], "dev VM"), [])

    def test_an_unknown_machine_is_refused(self):
        with self.assertRaises(SystemExit), redirect_stderr(io.StringIO()):
            bt.ingest(self.cur, [self.write("g.json", gpubox_results())], "a machine nobody named")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
