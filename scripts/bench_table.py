#!/usr/bin/env python3
"""The current-figures table at the top of BENCHMARKS.md, generated.

  scripts/bench_table.py                      print the table rendered from docs/bench/current.json
  scripts/bench_table.py --write              put it into BENCHMARKS.md (between its markers)
  scripts/bench_table.py --check              exit 1 when BENCHMARKS.md's table is not the rendered one
  scripts/bench_table.py ingest RESULTS.json [RESULTS.json ...] --machine ID [--write]
                                              refresh the figures those results measure

docs/bench/current.json holds one entry per headline figure: what it is, the value, the limit or
peer it is measured against (its value), how the ratio is shown, the aim when there is one, the
command, date, machine and load. The renderer computes every ratio from the two values, so the
table cannot disagree with the numbers it shows.

`ingest` reads the JSON the benchmark scripts write (scripts/bench_gpubox.sh's results.json:
summary and components; scripts/bench_scale.sh's results.json: runs per vocabulary size;
scripts/bench_peer_paddle.sh's report_<precision>.json and report_ps.json) and updates each
figure whose "source" names that script and whose data the files hold: value, limit value,
date, machine, load and command. Figures with no "source" (serving, step counts, the dense net,
the planted-data quality) are entered by hand from their command's output. Standard library
only.
"""
import argparse
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CURRENT = os.path.join(REPO, "docs", "bench", "current.json")
BENCHMARKS = os.path.join(REPO, "BENCHMARKS.md")
BEGIN = "<!-- bench table: begin -->\n"
END = "<!-- bench table: end -->"


def fail(msg):
    print(f"bench_table.py: {msg}", file=sys.stderr)
    sys.exit(2)


# ---- rendering ----

def number(x, digits):
    return f"{x:,.{digits}f}"


def quantity(x, digits, unit):
    return number(x, digits) + (f" {unit}" if unit else "")


def ratio_text(f):
    """The ratio column, computed from value and limit_value as the entry's "ratio" says."""
    kind = f.get("ratio", "times")
    v, lim = f["value"], f.get("limit_value")
    if kind == "none" or lim is None:
        return f.get("ratio_text", "—")
    if kind == "times":
        return f"{v / lim:.2f}×"
    if kind == "fraction":
        return f"{v / lim:.2f}"
    if kind == "percent":
        p = 100.0 * v / lim
        return f"{p:.1f}%" if p < 10 else f"{p:.0f}%"
    if kind == "difference":
        return f"{v - lim:+.{f.get('digits', 0)}f}"
    fail(f"figure {f['id']}: unknown ratio kind '{kind}'")


def slug(heading):
    """GitHub's anchor for a Markdown heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(current):
    machines = current["machines"]
    L = ["| figure | measured | limit or peer | ratio | aim | command | date, machine (load) |",
         "|---|---:|---|---:|---|---|---|"]
    for f in current["figures"]:
        digits, unit = f.get("digits", 0), f.get("unit", "")
        figure = f["figure"]
        if f.get("section"):
            figure += f" ([more](#{slug(f['section'])}))"
        limit = f["limit"]
        if f.get("limit_value") is not None:
            limit += ": " + quantity(f["limit_value"], f.get("limit_digits", digits),
                                     f.get("limit_unit", unit))
        if f["machine"] not in machines:
            fail(f"figure {f['id']}: machine '{f['machine']}' is not in \"machines\"")
        when = f"{f['date']}, {f['machine']}" + (f" ({f['load']})" if f.get("load") else "")
        L.append("| " + " | ".join(cell(c) for c in (
            figure, quantity(f["value"], digits, unit) + (f" ({f['detail']})" if f.get("detail") else ""),
            limit, ratio_text(f), f.get("aim", "—"),
            f"`{f['command']}`", when)) + " |")
    L.append("")
    L.append("Machines: " + "; ".join(f"**{k}**: {v}" for k, v in machines.items()) + ".")
    return "\n".join(L) + "\n"


def table_in(text, path):
    b, e = text.find(BEGIN), text.find(END)
    if b < 0 or e < 0 or e < b:
        fail(f"{path} has no '{BEGIN.strip()}' ... '{END}' markers")
    return b + len(BEGIN), e


def load_current(path):
    with open(path) as fh:
        current = json.load(fh)
    ids = [f["id"] for f in current["figures"]]
    if len(ids) != len(set(ids)):
        fail(f"{path}: two figures share an id")
    return current


def check_sections(current, text, path):
    """Every figure's "section" is a heading of the file the table sits in."""
    headings = {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}
    missing = [f["id"] for f in current["figures"]
               if f.get("section") and slug(f["section"]) not in headings]
    return missing


# ---- ingesting the benchmark scripts' JSON ----

def kind_of(results):
    if results.get("kind") == "bench_peer_paddle.sh":
        return "bench_peer_paddle.sh"
    if "summary" in results and "component_table" in results:
        return "bench_gpubox.sh"
    if "meta" in results and "runs" in results and all("vocab" in r for r in results["runs"]):
        return "bench_scale.sh"
    return None


def from_gpubox(src, results):
    """(value, limit_value, load) of a figure measured by bench_gpubox.sh, or None."""
    get = src["get"]
    comp = results.get("components") or {}
    if get == "train":
        s = next((s for s in results["summary"] if s["cards"] == src["cards"]), None)
        dense = next((d for k, d in comp.items() if k.startswith("dense_") and d
                      and d.get("cards") == src["cards"]), None)
        if s is None or dense is None:
            return None
        return s["ips_median"], dense["flop_limit_examples_per_sec"], s["loadavg_median"]
    if get == "dense":
        d = next((d for k, d in comp.items() if k.startswith("dense_") and d
                  and d.get("cards") == src["cards"]), None)
        return None if d is None else (d["examples_per_sec"], d["flop_limit_examples_per_sec"], None)
    if get == "hashtable" and comp.get("hashtable"):
        d = comp["hashtable"]
        t = next((t for t in d["card_table"] if t["threads"] == src["threads"]), None)
        op = src["op"]
        return None if t is None else (t[op + "_mops"], d["absl_flat_hash_map"][op + "_mops"], None)
    if get == "server" and comp.get("server"):
        d, op = comp["server"], src["op"]
        return d[op]["rows_per_s"] / 1e6, d["table_" + op]["rows_per_s"] / 1e6, None
    if get == "dataset" and comp.get("dataset"):
        d = comp["dataset"]
        t = next((t for t in d["threads"] if t["threads"] == src["threads"]), None)
        return None if t is None or not d.get("cat_mb_per_s") else (t["mb_per_s"], d["cat_mb_per_s"], None)
    return None


def prefetch_off(results):
    return "runner.prefetch_passes=0" in results["meta"].get("extra_overrides", "")


def scale_run(files, vocab, off=False, plain=True):
    """The run of that vocabulary in the first file that has one (prefetch on or off; plain:
    no other override)."""
    for r in files:
        extra = r["meta"].get("extra_overrides", "")
        if prefetch_off(r) != off or (plain and not off and extra):
            continue
        for run in r["runs"]:
            if run["vocab"] == vocab and not run.get("partial"):
                return r, run
    return None, None


def from_scale(src, files):
    get = src["get"]
    if get == "examples_ratio":
        r, big = scale_run(files, src["vocab"])
        _, base = scale_run(files, src["base_vocab"])
        if big is None or base is None:
            return None
        return big["examples_per_s_after_pass0"], base["examples_per_s_after_pass0"], r
    if get == "visible_begin":
        r, on = scale_run(files, src["vocab"])
        _, off = scale_run(files, src["vocab"], off=True)
        if on is None or off is None:
            return None
        first = src.get("from_pass", 2)
        return sum(on["visible_begin_s"][first:]), sum(off["visible_begin_s"][first:]), r
    return None


def gpubox_load(results):
    loads = [s["loadavg_median"] for s in results["summary"] if s.get("loadavg_median") is not None]
    return f"load {min(loads):.1f}–{max(loads):.1f}" if loads else ""


def auc(x):
    return "n/a" if x is None else f"{x:.4f}"


def from_peer(src, files):
    """(value, limit_value, detail, results) of a figure of bench_peer_paddle.sh's report JSON
    (scripts/peer/report.py, report_ps.py), or None."""
    for r in files:
        if src["get"] == "gpubox_mode" and r["mode"] == "gpubox" and r["precision"] == src["precision"]:
            return r["gpubox_examples_per_s"], r["paddle_examples_per_s"], None, r
        if src["get"] == "held_out" and r["mode"] == "gpubox" and r["precision"] == src["precision"]:
            e = next((h for h in r["held_out"] if h["epoch"] == src["epoch"]), None)
            if e is None or e["gpubox"] is None or e["paddle"] is None:
                continue
            return e["gpubox"], e["paddle"], None, r
        if src["get"] == "ps" and r["mode"] == "ps" and src["mode"] in r["modes"]:
            m = r["modes"][src["mode"]]
            detail = f"held-out AUC {auc(m['gpubox_test_auc'])} vs {auc(m['paddle_test_auc'])}"
            return m["gpubox_examples_per_s"], m["paddle_examples_per_s"], detail, r
    return None


def ingest(current, paths, machine):
    """Refreshes the figures the files measure; returns their ids. machine: the "machines" key
    of the machine the files were measured on."""
    if machine not in current["machines"]:
        fail(f"--machine '{machine}' is not in \"machines\" of the current figures: add it there")
    by_kind = {}
    for p in paths:
        with open(p) as fh:
            results = json.load(fh)
        k = kind_of(results)
        if k is None:
            fail(f"{p}: not the JSON of bench_gpubox.sh, bench_scale.sh or bench_peer_paddle.sh")
        by_kind.setdefault(k, []).append(results)
    updated = []
    for f in current["figures"]:
        src = f.get("source")
        if not src or src["script"] not in by_kind:
            continue
        if src["script"] == "bench_gpubox.sh":
            for results in by_kind["bench_gpubox.sh"]:
                if src.get("config") and not results["config"]["path"].endswith(src["config"]):
                    continue
                got = from_gpubox(src, results)
                if got is None:
                    continue
                f["value"], f["limit_value"], _ = got
                f["date"] = (results.get("date_utc") or "")[:10] or f["date"]
                f["command"] = results["command"]
                f["load"] = gpubox_load(results)
                break
            else:
                continue
        elif src["script"] == "bench_peer_paddle.sh":
            got = from_peer(src, by_kind["bench_peer_paddle.sh"])
            if got is None:
                continue
            f["value"], f["limit_value"], detail, r = got
            if detail:
                f["detail"] = detail
            f["date"] = (r.get("date_utc") or "")[:10] or f["date"]
            f["command"] = r.get("command") or f["command"]
            f["load"] = f"load {r['modes'][src['mode']]['load']}" if src["get"] == "ps" else \
                (f"load {r['load']}" if r.get("load") else "")
        else:
            got = from_scale(src, by_kind["bench_scale.sh"])
            if got is None:
                continue
            f["value"], f["limit_value"], r = got
            meta = r["meta"]
            f["date"] = (meta.get("date_utc") or "")[:10] or f["date"]
            f["command"] = meta.get("command") or f["command"]
            f["load"] = f"load at end {meta.get('load_average_at_end')}"
        f["machine"] = machine
        updated.append(f["id"])
    return updated


# ---- main ----

def write_table(text, table, path):
    b, e = table_in(text, path)
    return text[:b] + table + text[e:]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", nargs="?", choices=["ingest"], help="refresh figures from results.json")
    ap.add_argument("results", nargs="*", help="JSON of bench_gpubox.sh, bench_scale.sh, bench_peer_paddle.sh")
    ap.add_argument("--current", default=CURRENT)
    ap.add_argument("--benchmarks", default=BENCHMARKS)
    ap.add_argument("--write", action="store_true", help="write the table into --benchmarks")
    ap.add_argument("--check", action="store_true", help="exit 1 when --benchmarks is stale")
    ap.add_argument("--machine", help="ingest: the \"machines\" key the results were measured on")
    a = ap.parse_args(argv)
    current = load_current(a.current)

    if a.cmd == "ingest":
        if not a.results:
            fail("ingest needs at least one results.json")
        if not a.machine:
            fail("ingest needs --machine ID (a key of \"machines\" in the current figures)")
        updated = ingest(current, a.results, a.machine)
        print("bench_table.py: updated " + (", ".join(updated) if updated else "nothing"))
        with open(a.current, "w") as fh:
            json.dump(current, fh, indent=1, ensure_ascii=False)
            fh.write("\n")

    table = render(current)
    if not (a.write or a.check):
        sys.stdout.write(table)
        return 0
    with open(a.benchmarks) as fh:
        text = fh.read()
    missing = check_sections(current, text, a.benchmarks)
    if missing:
        fail(f"{a.benchmarks}: no heading for the \"section\" of {', '.join(missing)}")
    if a.check:
        b, e = table_in(text, a.benchmarks)
        if text[b:e] != table:
            print(f"bench_table.py: the table in {a.benchmarks} is not what {a.current} renders; "
                  "run scripts/bench_table.py --write", file=sys.stderr)
            return 1
        print(f"bench_table.py: {a.benchmarks} is current")
        return 0
    with open(a.benchmarks, "w") as fh:
        fh.write(write_table(text, table, a.benchmarks))
    print(f"bench_table.py: wrote the table into {a.benchmarks}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
