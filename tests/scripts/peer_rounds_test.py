#!/usr/bin/env python3
"""python3 tests/scripts/peer_rounds_test.py REPO

scripts/peer_rounds.py (the summary of scripts/bench_peer_rounds.sh) on hand-made
bench_peer_paddle.sh reports against figures worked out here: each round's ratio within the
round, the median of an odd and an even count of rounds, the held-out AUC after the timed epoch
only, rounds ordered by number (r10 after r2), report_ps.json and other folders ignored, and a
run without both systems' examples/s, or a round folder without its report, refused naming it. No Paddle needed. Standard
library only."""
import json
import os
import sys
import tempfile
import unittest

REPO = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                       os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_test_util import load_script, read, run_main  # noqa: E402

pr = load_script(REPO, "peer_rounds")


def report(folder, precision, gpubox, paddle, aucs, timed_epoch=2):
    os.makedirs(folder, exist_ok=True)
    held = [{"epoch": e + 1, "gpubox": g, "paddle": p} for e, (g, p) in enumerate(aucs)]
    with open(os.path.join(folder, f"report_{precision}.json"), "w") as fh:
        json.dump({"gpubox_examples_per_s": gpubox, "paddle_examples_per_s": paddle,
                   "timed_epoch": timed_epoch, "held_out": held, "load": "1.0 / 1.0"}, fh)


class PeerRoundsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_ratios_are_taken_within_a_round_and_their_median_reported(self):
        d = self.dir
        # dcn: rounds 1, 2 and 10 (r10 sorts after r2): ratios 3.0, 2.0, 4.0 -> median 3.0.
        report(f"{d}/r1-dcn", "fp32", 300.0, 100.0, [(0.5, 0.6), (0.75, 0.74)])
        report(f"{d}/r2-dcn", "fp32", 100.0, 50.0, [(0.5, 0.6), (0.76, 0.73)])
        report(f"{d}/r10-dcn", "fp32", 400.0, 100.0, [(0.5, 0.6), (0.75, 0.74)])
        # dlrm, two rounds and two precisions: fp32 ratios 2.5 and 3.5 -> median 3.0; bf16 5.0, 7.0.
        report(f"{d}/r1-dlrm", "fp32", 250.0, 100.0, [(0.7, 0.7), (0.72, 0.69)])
        report(f"{d}/r1-dlrm", "bf16", 500.0, 100.0, [(0.7, 0.7), (0.72, 0.69)])
        report(f"{d}/r2-dlrm", "fp32", 350.0, 100.0, [(0.7, 0.7), (0.72, 0.69)])
        report(f"{d}/r2-dlrm", "bf16", 700.0, 100.0, [(0.7, 0.7), (0.72, 0.69)])
        report(f"{d}/r1-dlrm", "ps", 1.0, 1.0, [])  # a PS report: not this summary's
        os.makedirs(f"{d}/data")                    # not a round
        rows = {(r["model"], r["precision"]): r for r in pr.summarise(pr.collect(d))}
        self.assertEqual(sorted(rows), [("dcn", "fp32"), ("dlrm", "bf16"), ("dlrm", "fp32")])
        dcn = rows[("dcn", "fp32")]
        self.assertEqual(dcn["ratios"], [3.0, 2.0, 4.0])  # r1, r2, r10
        self.assertEqual(dcn["median_ratio"], 3.0)
        self.assertEqual(dcn["gpubox_auc"], "0.7500–0.7600")  # the timed epoch's, not epoch 1's
        self.assertEqual(dcn["paddle_auc"], "0.7300–0.7400")
        self.assertEqual(rows[("dlrm", "fp32")]["median_ratio"], 3.0)
        self.assertEqual(rows[("dlrm", "bf16")]["median_ratio"], 6.0)
        self.assertEqual(rows[("dlrm", "fp32")]["gpubox_auc"], "0.7200")

    def test_main_prints_and_writes_the_table(self):
        d = self.dir
        report(f"{d}/r1-fm", "fp32", 1234.0, 617.0, [(0.6, 0.5), (0.61, 0.55)])
        md, js = f"{d}/rounds.md", f"{d}/rounds.json"
        rc, out, _ = run_main(pr.main, [d, "--md", md, "--json", js])
        self.assertEqual(rc, 0)
        self.assertIn("| fm | fp32 | 1,234 | 617 | 2.00 | **2.00×** | 0.6100 / 0.5500 |", out)
        self.assertEqual(read(md), out)
        self.assertEqual(json.loads(read(js))["rows"][0]["median_ratio"], 2.0)

    def test_a_run_without_both_figures_is_refused_naming_it(self):
        d = self.dir
        report(f"{d}/r1-dcn", "fp32", 300.0, 0.0, [])
        with self.assertRaises(SystemExit) as e:
            pr.collect(d)
        self.assertIn("r1-dcn/report_fp32.json", str(e.exception.code))

    def test_a_round_without_its_report_is_refused_naming_it(self):
        d = self.dir
        report(f"{d}/r1-dcn", "fp32", 300.0, 100.0, [(0.5, 0.6), (0.75, 0.74)])
        os.makedirs(f"{d}/r2-dcn")  # stopped before it wrote its report
        with self.assertRaises(SystemExit) as e:
            pr.collect(d)
        self.assertIn("r2-dcn: no report_<precision>.json", str(e.exception.code))

    def test_a_truncated_report_is_refused_naming_it(self):
        os.makedirs(f"{self.dir}/r1-dcn")
        with open(f"{self.dir}/r1-dcn/report_fp32.json", "w") as fh:
            fh.write('{"gpubox_examples_per_s": 3')
        with self.assertRaises(SystemExit) as e:
            pr.collect(self.dir)
        self.assertIn("r1-dcn/report_fp32.json: not JSON", str(e.exception.code))

    def test_no_rounds_is_an_error(self):
        rc, _, err = run_main(pr.main, [self.dir])
        self.assertEqual(rc, 1)
        self.assertIn("no r<round>-<model>", err)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
