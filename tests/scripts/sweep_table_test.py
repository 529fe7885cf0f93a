#!/usr/bin/env python3
"""python3 tests/scripts/sweep_table_test.py REPO

scripts/sweep_table.py against hand-written oracles: README.md's PaddleRec table is what the
committed sweep (docs/bench/paddlerec_sweep.tsv) renders, --check fails on a stale copy and
--write repairs it, and a tiny TSV (a refused row with its reason, a row that loads only,
families with and without a note) renders to the table written out here. No PaddleRec needed.
Standard library only."""
import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr

REPO = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_test_util import load_script, read, run_main, write  # noqa: E402

st = load_script(REPO, "sweep_table")

TINY = ("# paddlerec: 656326ad\n# gpubox: 0123abcd\n# date: 2026-12-01\n"
        "# paddle: not importable\n# timeout: 120s\n"
        "dnn/config.yaml\ttrains\tdnn\tgpubox mode, auc: 0.61\n"
        "dnn/config_to_static.yaml\trefused\t-\tmodel_init_path 'out/2' names no save\n"
        "fm/config.yaml\ttrains\tfm\tgpubox mode, auc: 0.55\n"
        "flen/config.yaml\tloads\tflen\ttraining failed (exit 1): a | b\n"
        "dnn/config_bigdata.yaml\ttrains\tdnn\tgpubox mode, auc: 0.62\n"
        "# seconds: 42\n")
TINY_TABLE = (
    "Last run on 2026-12-01 (GPUBox 0123abcd, PaddleRec 656326ad, Paddle not importable, so "
    "GPUBox read the files itself) in 42 s: 5 configs, 3 train, 1 load only, 1 refused.\n"
    "\n"
    "| family | configs | train unchanged | the others, and why (the sweep's words) | note |\n"
    "|---|---:|---:|---|---|\n"
    "| dnn, fm | 4 | 3 | `dnn/config_to_static.yaml` refused: model_init_path 'out/2' names no "
    "save | — |\n"
    "| flen | 1 | 0 | `flen/config.yaml` loads: training failed (exit 1): a \\| b | "
    + st.NOTES["flen"] + " |\n")


def run(argv):
    return run_main(st.main, argv)


class Render(unittest.TestCase):
    def test_tiny_sweep_renders_to_the_oracle(self):
        self.assertEqual(st.render(*st.parse(TINY)), TINY_TABLE)

    def test_header_and_rows_are_read(self):
        header, rows = st.parse(TINY)
        self.assertEqual(header["paddlerec"], "656326ad")
        self.assertEqual(header["seconds"], "42")
        self.assertEqual([r["family"] for r in rows], ["dnn", "dnn", "fm", "flen", "dnn"])
        self.assertEqual(rows[1]["detail"], "model_init_path 'out/2' names no save")

    def test_a_long_reason_is_cut(self):
        reason = "x" * (st.DETAIL_CHARS + 40)
        _, rows = st.parse(f"fm/a.yaml\trefused\t-\t{reason}\n")
        cut = st.render({}, rows).splitlines()[-1].split(" | ")[3]
        self.assertEqual(cut, "`fm/a.yaml` refused: " + "x" * (st.DETAIL_CHARS - 1) + "…")

    def test_a_row_that_is_not_a_sweep_row_is_refused(self):
        for bad in ("dnn/config.yaml\ttrains\tdnn\n", "dnn/config.yaml\tbroken\tdnn\tx\n", "# only\n"):
            with redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
                st.parse(bad)


class Readme(unittest.TestCase):
    def test_readme_table_is_the_committed_sweeps(self):
        rc, _, err = run(["--check"])
        self.assertEqual(rc, 0, err + "\nregenerate with: scripts/sweep_table.py --write")

    def test_committed_sweep_names_its_commits(self):
        header, rows = st.parse(read(st.TSV), st.TSV)
        for key in ("paddlerec", "gpubox", "date", "paddle", "seconds"):
            self.assertTrue(header.get(key), f"{st.TSV} has no '# {key}:' line")
        self.assertGreater(len(rows), 0)

    def test_check_fails_on_a_stale_copy_and_write_repairs_it(self):
        with tempfile.TemporaryDirectory() as d:
            tsv, readme = os.path.join(d, "s.tsv"), os.path.join(d, "README.md")
            write(tsv, TINY)
            write(readme, "intro\n" + st.BEGIN + TINY_TABLE.replace("| 4 | 3 |", "| 4 | 4 |")
                  + st.END + "\nafter\n")
            rc, _, err = run(["--tsv", tsv, "--readme", readme, "--check"])
            self.assertEqual(rc, 1, err)
            self.assertEqual(run(["--tsv", tsv, "--readme", readme, "--write"])[0], 0)
            self.assertEqual(read(readme), "intro\n" + st.BEGIN + TINY_TABLE + st.END + "\nafter\n")
            self.assertEqual(run(["--tsv", tsv, "--readme", readme, "--check"])[0], 0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=1)
