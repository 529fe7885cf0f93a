#!/usr/bin/env python3
"""Report of scripts/bench_gpubox.sh: reads OUT/runs (gpubox_train JSON lines), OUT/components
(gpubox_bench output) and OUT/machine.env; writes OUT/results.json, OUT/report.md,
OUT/throughput.dat and OUT/throughput.gp (the gnuplot script for OUT/throughput.png).
Standard library only."""
import argparse
import csv
import json
import os
import re
import statistics
import sys


def fail(msg):
    print(f"bench_report.py: {msg}", file=sys.stderr)
    sys.exit(2)


def read_jsonl(path):
    passes, tests = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{path}:{n}: not JSON ({e})")
            if "pass" in obj:
                passes.append(obj)
            elif "test_auc" in obj:
                tests.append(obj)
    return passes, tests


def median(xs):
    return statistics.median(xs) if xs else None


def fmt(x, digits=0):
    if x is None:
        return "—"
    if isinstance(x, int) or digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def config_facts(path):
    """The few scalar keys the report states, read with a regex (no YAML module in stdlib)."""
    keys = ["train_batch_size", "epochs", "thread_num", "model", "fc_sizes", "sparse_feature_dim",
            "sparse_inputs_slots", "dense_input_dim", "card_memory_mb", "use_cvm"]
    facts = {}
    section = ""
    with open(path) as f:
        for line in f:
            m = re.match(r"^(\w+):", line)
            if m:
                section = m.group(1)
            body = line.split("#", 1)[0].rstrip()
            m = re.match(r"^\s+(\w+):\s*(\S.*)$", body)
            if m and m.group(1) in keys and m.group(1) not in facts:
                facts[m.group(1)] = m.group(2).strip().strip('"')
            m = re.match(r"^\s+class:\s*(\S+)", body)
            if m:
                facts.setdefault("dense_optimizer" if "sparse" not in section else "sparse_optimizer",
                                 m.group(1))
    # the sparse optimizer's class sits under hyper_parameters.sparse_optimizer
    with open(path) as f:
        text = f.read()
    m = re.search(r"sparse_optimizer:[^\n]*\n\s+class:\s*(\w+)", text)
    if m:
        facts["sparse_optimizer"] = m.group(1)
    m = re.search(r"\n\s+optimizer:[^\n]*\n\s+class:\s*(\w+)", text)
    if m:
        facts["dense_optimizer"] = m.group(1)
    return facts


def load_component(path):
    with open(path) as f:
        text = f.read()
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                break
    return None


def parse_dataset(text):
    res = {"threads": []}
    for m in re.finditer(r"threads (\d+): load ([\d.]+) s, ([\d.]+) MB/s, (\d+) instances/s; "
                         r"CPU ([\d.]+) s = ([\d.]+) MB per CPU-second", text):
        res["threads"].append({"threads": int(m.group(1)), "load_s": float(m.group(2)),
                               "mb_per_s": float(m.group(3)), "instances_per_s": int(m.group(4)),
                               "mb_per_cpu_s": float(m.group(6))})
    m = re.search(r"cat > /dev/null: ([\d.]+) s, ([\d.]+) MB/s for ([\d.]+) MB", text)
    if m:
        res["cat_mb_per_s"] = float(m.group(2))
        res["mb"] = float(m.group(3))
    m = re.search(r"fill_batch \(batch (\d+)[^)]*\): .* ([\d.]+) instances/s, ([\d.]+) keys/s", text)
    if m:
        res["fill_batch_instances_per_s"] = float(m.group(2))
    return res if res["threads"] else None


def components(out):
    cdir = os.path.join(out, "components")
    if not os.path.isdir(cdir):
        return None, []
    comp = {}
    rows = []  # (bench, command, figure, limit, ratio)

    def cmd(name):
        p = os.path.join(cdir, name + ".cmd")
        return "gpubox_bench " + open(p).read().strip() if os.path.exists(p) else ""

    def have(name):
        return os.path.exists(os.path.join(cdir, name + ".out"))

    memcpy = []  # one thread's memcpy GB/s from this run (comm, table)
    names = sorted(n[:-4] for n in os.listdir(cdir) if n.endswith(".out"))
    for name in names:
        path = os.path.join(cdir, name + ".out")
        if name == "dataset":
            comp[name] = parse_dataset(open(path).read())
        else:
            comp[name] = load_component(path)
        if comp[name] is None:
            fail(f"{path}: no result found in the bench output")
    for name in names:
        d = comp[name]
        if name.startswith("comm_"):
            memcpy.append(d["memcpy_gbps"])
        if name == "table":
            memcpy.append(d["memcpy_GBps"])
    memcpy_med = median(memcpy)

    if have("hashtable"):
        d = comp["hashtable"]
        a = d["absl_flat_hash_map"]
        for t in d["card_table"]:
            for op in ("insert", "find_hit", "find_miss"):
                rows.append(("hashtable", cmd("hashtable"),
                             f"CardHashTable {t['threads']} thread(s) {op}: {t[op + '_mops']:.2f} M ops/s",
                             f"absl::flat_hash_map (1 thread, same run): {a[op + '_mops']:.2f} M ops/s",
                             f"{t[op + '_ratio']:.2f}×"))
    for name in names:
        d = comp[name]
        if name.startswith("dense_"):
            rows.append(("dense", cmd(name),
                         f"{d['cards']} card(s) × {d['threads_per_card']} thread(s), batch {d['batch']}: "
                         f"{d['examples_per_sec']:,.0f} examples/s ({d['examples_per_sec_min']:,.0f}–{d['examples_per_sec_max']:,.0f})",
                         f"sgemm {d['sgemm_gflops']:.1f} GFLOP/s ÷ {d['flops_per_example']/1e6:.2f} MFLOP/example "
                         f"= {d['flop_limit_examples_per_sec']:,.0f} examples/s",
                         f"{d['fraction_of_limit']:.2f}"))
        if name.startswith("sparse_"):
            gbs = d["row_bytes_touched_per_card"] / (d["step_ms"] / 1e3) / 1e9
            lim = f"memcpy {memcpy_med:.1f} GB/s (one thread, this run)" if memcpy_med else "no memcpy figure in this run"
            rows.append(("sparse", cmd(name),
                         f"{d['cards']} card(s), batch {d['batch']}: {d['keys_per_sec_per_card']/1e6:.2f} M keys/s per card, "
                         f"step {d['step_ms']:.2f} ms, rows touched {gbs:.2f} GB/s per card",
                         lim, f"{gbs / memcpy_med:.3f}" if memcpy_med else "—"))
        if name.startswith("comm_"):
            for op in ("all_reduce_sum", "all_to_all_v"):
                rows.append(("comm", cmd(name),
                             f"{d['ranks']} ranks {op}: busbw {d[op]['busbw_gbps']:.2f} GB/s (algbw {d[op]['algbw_gbps']:.2f})",
                             f"memcpy {d['memcpy_gbps']:.1f} GB/s (one thread, same run)",
                             f"{d[op]['busbw_gbps'] / d['memcpy_gbps']:.3f}"))
    if have("server"):
        d = comp["server"]
        for op in ("pull", "push"):
            rows.append(("server", cmd("server"),
                         f"{d['clients']} client(s) {op}: {d[op]['rows_per_s']/1e6:.2f} M rows/s "
                         f"({d[op]['mb_per_s']:.0f} MB/s, p50 {d[op]['p50_ms']:.2f} / p99 {d[op]['p99_ms']:.2f} ms)",
                         f"in-process table {op} {d['table_' + op]['rows_per_s']/1e6:.2f} M rows/s; "
                         f"loopback TCP {d['loopback_tcp_mb_per_s']:,.0f} MB/s (same run)",
                         f"{d[op]['rows_per_s'] / d['table_' + op]['rows_per_s']:.2f} / "
                         f"{d[op]['mb_per_s'] / d['loopback_tcp_mb_per_s']:.2f}"))
    if have("table"):
        d = comp["table"]
        lim = d["memcpy_rows_per_s"]
        for key, label in (("t1", "1 thread"), ("t2", "2 threads"), ("disk", f"RocksDB tier ({d['disk']['rows']} rows, budget {d['disk']['memory_row_budget']})")):
            for op in ("pull", "push", "insert"):
                v = d[key][op + "_rows_per_s"]
                rows.append(("table", cmd("table"), f"{label} {op}: {v/1e6:.2f} M rows/s",
                             f"memcpy of the rows {lim/1e6:.0f} M rows/s (same run)", f"{v / lim:.4f}"))
        for key in ("checkpoint_binary", "checkpoint_text"):
            c = d[key]
            rows.append(("table", cmd("table"),
                         f"{key} save / load: {c['save_rows_per_s']/1e6:.2f} / {c['load_rows_per_s']/1e6:.2f} M rows/s",
                         f"memcpy {lim/1e6:.0f} M rows/s", f"{c['save_rows_per_s']/lim:.4f} / {c['load_rows_per_s']/lim:.4f}"))
        if d.get("cpu_share_1t", 1) < 0.8:
            rows.append(("table", cmd("table"), f"CPU share the bench measured for itself: {d['cpu_share_1t']:.2f} core",
                         "1.0 core", "rates are low by that factor"))
    if have("dataset"):
        d = comp["dataset"]
        for t in d["threads"]:
            rows.append(("dataset", cmd("dataset"),
                         f"{t['threads']} reader thread(s): {t['mb_per_s']:.0f} MB/s, {t['instances_per_s']:,} instances/s "
                         f"({t['mb_per_cpu_s']:.0f} MB per CPU-second)",
                         f"cat > /dev/null of the same {d.get('mb', 0):.0f} MB: {d.get('cat_mb_per_s', 0):,.0f} MB/s (same run)",
                         f"{t['mb_per_s'] / d['cat_mb_per_s']:.3f}" if d.get("cat_mb_per_s") else "—"))
    return comp, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--data-reused", default="0")
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--extra", default="")
    a = ap.parse_args()
    out = a.out

    machine = {}
    with open(os.path.join(out, "machine.env")) as f:
        for line in f:
            k, _, v = line.rstrip("\n").partition("=")
            machine[k] = v

    runs = []
    with open(os.path.join(out, "runs", "manifest.tsv")) as f:
        for row in csv.DictReader(f, delimiter="\t"):
            passes, tests = read_jsonl(row["metrics"])
            if len(passes) != a.epochs:
                fail(f"{row['metrics']}: {len(passes)} pass lines, expected {a.epochs}")
            warm = passes[1:] if len(passes) >= 2 else passes
            ex = sum(p["examples"] for p in warm)
            sec = sum(p["seconds"] for p in warm)
            runs.append({
                "cards": int(row["cards"]), "repeat": int(row["repeat"]), "wall_s": float(row["wall_s"]),
                "loadavg_before": float(row["loadavg_before"]), "loadavg_after": float(row["loadavg_after"]),
                "measured_passes": [p["pass"] for p in warm],
                "ips": ex / sec, "ips_first_pass": passes[0]["ips"],
                "passes": passes, "tests": tests,
                "metrics": os.path.relpath(row["metrics"], out), "log": os.path.relpath(row["log"], out),
            })
    if not runs:
        fail("no runs in runs/manifest.tsv")

    card_counts = sorted({r["cards"] for r in runs})
    summary = []
    for c in card_counts:
        rs = [r for r in runs if r["cards"] == c]
        ips = [r["ips"] for r in rs]
        warm = [p for r in rs for p in r["passes"] if p["pass"] in r["measured_passes"]]
        phases = {k: median([p[k + "_seconds"] for p in warm]) for k in ("load", "begin_pass", "train", "end_pass")}
        phases["pass"] = median([p["seconds"] for p in warm])
        summary.append({
            "cards": c, "runs": len(rs), "examples_per_pass": rs[0]["passes"][0]["examples"],
            "ips_median": median(ips), "ips_min": min(ips), "ips_max": max(ips),
            "ips_per_card_median": median(ips) / c,
            "ips_first_pass_median": median([r["ips_first_pass"] for r in rs]),
            "phases_median_s": phases,
            "begin_pass_first_pass_median_s": median([r["passes"][0]["begin_pass_seconds"] for r in rs]),
            "auc_last_pass_median": median([r["passes"][-1]["auc"] for r in rs]),
            "logloss_last_pass_median": median([r["passes"][-1]["logloss"] for r in rs]),
            "test_auc_last_median": median([r["tests"][-1]["test_auc"] for r in rs if r["tests"]]),
            "loadavg_median": median([r["loadavg_before"] for r in rs] + [r["loadavg_after"] for r in rs]),
        })
    base = next((s for s in summary if s["cards"] == 1), None)
    for s in summary:
        s["scaling_efficiency"] = s["ips_median"] / (s["cards"] * base["ips_median"]) if base else None

    oracle = {}
    for part in ("train", "test"):
        p = os.path.join(a.data, part, "oracle.json")
        if os.path.exists(p):
            oracle[part] = json.load(open(p))

    comp, comp_rows = components(out)
    cfg = config_facts(a.config)
    cores = int(machine.get("cores") or 0)
    cpu_build = machine.get("backend") == "cpu"
    commit = machine.get("commit", "unknown")
    dirty = int(machine.get("dirty") or 0)

    results = {
        "command": a.command, "extra_overrides": a.extra, "date_utc": machine.get("date_utc"),
        "machine": machine, "commit": commit, "uncommitted_tracked_changes": dirty,
        "config": {"path": a.config, **cfg, "epochs_run": a.epochs},
        "data": {"dir": a.data, "reused": a.data_reused == "1", "oracle": oracle},
        "measured": "examples/s of a run = examples / seconds over passes 1..E-1 (pass 0, with the "
                    "cold pulls, is the warm-up); with E = 1, pass 0",
        "summary": summary, "runs": runs, "components": comp,
        "component_table": [dict(zip(("bench", "command", "figure", "limit", "ratio"), r)) for r in comp_rows],
    }
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)

    # ---- report.md ----
    mem_gib = int(machine.get("mem_total_kb") or 0) / 1048576
    L = []
    L.append("# GPUBox training throughput per card count")
    L.append("")
    L.append(f"Command: `{a.command}`" + (f" (extra: `{a.extra}`)" if a.extra else ""))
    L.append("")
    L.append(f"- Date: {machine.get('date_utc')}")
    L.append(f"- Machine: {machine.get('cpu_model') or 'unknown CPU'}, {cores} cores, {mem_gib:.1f} GiB RAM, {machine.get('kernel')}")
    L.append(f"- GPU: {machine.get('gpu') or 'none (nvidia-smi absent or sees none)'}")
    L.append(f"- Backend: {machine.get('backend')} (binaries {machine.get('bin_dir')}, built {machine.get('train_bin_mtime')}"
             + (f", {machine.get('compiler')}" if machine.get("compiler") else "") + ")")
    L.append(f"- Commit: `{commit}`" + (f" with {dirty} uncommitted tracked change(s)" if dirty else ""))
    L.append(f"- Config: `{os.path.relpath(a.config, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}` — "
             f"model {cfg.get('model')}, fc {cfg.get('fc_sizes')}, {int(cfg.get('sparse_inputs_slots', 27)) - 1} slots × "
             f"{cfg.get('sparse_feature_dim')}, {cfg.get('dense_input_dim')} dense, batch {a.batch} per card, "
             f"dense {cfg.get('dense_optimizer')}, sparse {cfg.get('sparse_optimizer')}, reader threads {cfg.get('thread_num')}; "
             f"{a.epochs} pass(es) per run, no model save; sha256 {machine.get('config_sha256', '?')}…"
             + (" (uncommitted edits)" if machine.get("config_dirty", "0") not in ("", "0") else ""))
    tr, te = oracle.get("train", {}), oracle.get("test", {})
    L.append(f"- Data: `gpubox_data gen` {tr.get('lines', '?'):,} train lines in {tr.get('files', '?')} files "
             f"({tr.get('bytes', 0)/1e6:.0f} MB), {te.get('lines', '?'):,} held-out lines (seed {tr.get('seed')}, vocab {tr.get('vocab')}, "
             f"zipf {tr.get('zipf')}); {'reused' if a.data_reused == '1' else 'generated'} at `{a.data}`; "
             f"planted model's AUC (the ceiling): train {tr.get('auc', 0):.4f}, test {te.get('auc', 0):.4f}")
    if cpu_build:
        tpc = machine.get("threads_per_card")
        L.append(f"- Host threads per simulated card: {tpc + ' (--threads_per_card)' if tpc else 'gpubox_train default, cores ÷ cards'}")
    if machine.get("omp_num_threads"):
        L.append(f"- OMP_NUM_THREADS={machine['omp_num_threads']}")
    L.append("")
    measured = "pass 0 (one pass per run: no warm-up excluded)" if a.epochs == 1 else (
        "pass 1" if a.epochs == 2 else f"passes 1..{a.epochs - 1}")
    L.append("examples/s of a run = examples ÷ seconds of " + measured
             + " (pass 0 pulls every key cold: the warm-up, shown apart); median and min–max over runs; "
             "ips counts the examples of all cards. Phase times are medians over the measured passes.")
    L.append("")
    if cpu_build:
        L.append(f"**cpu build: the simulated cards share this machine's {cores} cores**, so the scaling figures show how "
                 f"the same work divides over {cores} cores, not how that many GPUs would scale.")
        L.append("")
    L.append("| cards | runs | examples/s median (min–max) | examples/s per card | scaling efficiency"
             + (" (cards share the cores)" if cpu_build else "") +
             " | pass 0 examples/s | load s | begin_pass s (pass 0) | train s | end_pass s | train AUC (last pass) | test AUC | load avg |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        ph = s["phases_median_s"]
        eff = f"{s['scaling_efficiency']:.2f}" if s["scaling_efficiency"] is not None else "— (no 1-card run)"
        L.append(f"| {s['cards']} | {s['runs']} | {fmt(s['ips_median'])} ({fmt(s['ips_min'])}–{fmt(s['ips_max'])}) | "
                 f"{fmt(s['ips_per_card_median'])} | {eff} | {fmt(s['ips_first_pass_median'])} | {ph['load']:.2f} | "
                 f"{ph['begin_pass']:.3f} ({s['begin_pass_first_pass_median_s']:.3f}) | {ph['train']:.2f} | {ph['end_pass']:.3f} | "
                 f"{s['auc_last_pass_median']:.4f} | {fmt(s['test_auc_last_median'], 4)} | {s['loadavg_median']:.1f} |")
    L.append("")
    L.append("Runs (in the order they ran):")
    L.append("")
    L.append("| cards | repeat | examples/s (measured passes) | pass 0 examples/s | wall s | load avg before → after | log |")
    L.append("|---|---|---|---|---|---|---|")
    for r in sorted(runs, key=lambda r: (r["repeat"], card_counts.index(r["cards"]))):
        L.append(f"| {r['cards']} | {r['repeat']} | {fmt(r['ips'])} | {fmt(r['ips_first_pass'])} | {r['wall_s']:.1f} | "
                 f"{r['loadavg_before']:.2f} → {r['loadavg_after']:.2f} | `{r['log']}` |")
    L.append("")
    L.append("![examples/s and scaling efficiency](throughput.png)")
    if comp_rows:
        L.append("")
        L.append("## Components (`gpubox_bench`), each next to its limit measured in the same run")
        L.append("")
        if cpu_build:
            L.append(f"Simulated cards and bench threads share the same {cores} cores here too.")
            L.append("")
        L.append("| bench | figure | limit | ratio |")
        L.append("|---|---|---|---|")
        for b, _, fig, lim, ratio in comp_rows:
            L.append(f"| {b} | {fig} | {lim} | {ratio} |")
        L.append("")
        L.append("Commands:")
        L.append("")
        for c in dict.fromkeys(r[1] for r in comp_rows):
            L.append(f"- `{c}`")
        L.append("")
        L.append("The sparse row's limit is one thread's memcpy from the comm/table benches of this script run "
                 "(not the same process); the others are measured inside the same bench process.")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(L) + "\n")

    # ---- gnuplot data and script ----
    with open(os.path.join(out, "throughput.dat"), "w") as f:
        f.write("# cards ips_median ips_min ips_max scaling_efficiency ips_per_card\n")
        for s in summary:
            eff = s["scaling_efficiency"] if s["scaling_efficiency"] is not None else float("nan")
            f.write(f"{s['cards']} {s['ips_median']:.1f} {s['ips_min']:.1f} {s['ips_max']:.1f} {eff:.4f} {s['ips_per_card_median']:.1f}\n")
    title = f"GPUBox {machine.get('backend')} build, {cores} cores" + (" (simulated cards share the cores)" if cpu_build else "")
    xs = " ".join(str(c) for c in card_counts)
    gp = f"""if (strstrt(GPVAL_TERMINALS, "pngcairo") > 0) {{
  set terminal pngcairo size 960,560 font ",11"
}} else {{
  set terminal png size 960,560
}}
set output "{os.path.join(out, 'throughput.png')}"
set title "{title}\\ncommit {commit[:10]}, {tr.get('lines', 0)} lines, median of {len(runs) // len(card_counts)} runs (bars: min-max)"
set xlabel "cards"
set ylabel "examples/s (all cards)"
set y2label "scaling efficiency ips(C) / (C * ips(1))"
set xrange [{min(card_counts) - 0.5}:{max(card_counts) + 0.5}]
set xtics ({", ".join(f'"{c}" {c}' for c in card_counts)})
set yrange [0:*]
set y2range [0:1.2]
set ytics nomirror
set y2tics 0.2
set grid ytics
set key below
set datafile missing "nan"
plot "{os.path.join(out, 'throughput.dat')}" using 1:2:3:4 with yerrorlines lw 2 pt 7 title "examples/s (median, min-max)", \\
     "" using 1:6 with linespoints lw 1 pt 5 dt 2 title "examples/s per card", \\
     "" using 1:5 axes x1y2 with linespoints lw 2 pt 9 title "scaling efficiency (right axis)"
"""
    _ = xs
    with open(os.path.join(out, "throughput.gp"), "w") as f:
        f.write(gp)
    print(open(os.path.join(out, "report.md")).read())


if __name__ == "__main__":
    main()
