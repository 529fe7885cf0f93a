#!/usr/bin/env python3
"""README.md's PaddleRec model-zoo table, generated from a scripts/paddlerec_sweep.sh run.

  scripts/sweep_table.py                   print the table rendered from docs/bench/paddlerec_sweep.tsv
  scripts/sweep_table.py --write           put it into README.md (between its sweep markers)
  scripts/sweep_table.py --check           exit 1 when README.md's table is not the rendered one
  scripts/sweep_table.py --tsv FILE        another sweep's output (`paddlerec_sweep.sh --out FILE`)

The TSV is what `scripts/paddlerec_sweep.sh PADDLEREC_DIR --out FILE` writes: `# key: value`
header lines (the PaddleRec and GPUBox commits, the date, whether Paddle was importable, the
timeout, the run time) and one row per config: config, outcome (trains / loads / refused),
network, detail. The table has one row per family (families with the same note share one):
how many configs, how many train, each config that does not with its outcome and the sweep's
reason, and the family's note below. To refresh it: run the sweep with
`--out docs/bench/paddlerec_sweep.tsv`, then `scripts/sweep_table.py --write`. Standard library
only.
"""
import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TSV = os.path.join(REPO, "docs", "bench", "paddlerec_sweep.tsv")
README = os.path.join(REPO, "README.md")
BEGIN = "<!-- sweep table: begin -->\n"
END = "<!-- sweep table: end -->"
OUTCOMES = ("trains", "loads", "refused")
DETAIL_CHARS = 160  # a reason longer than this is cut (the TSV keeps it whole)

# One short clause per family; the details are in docs/paddlerec.md ("Coming from PaddleRec").
NOTES = {
    "slot_dnn": ("`feasign:slot` data; `config_offline_infer.yaml` is PaddleRec's offline inference, "
                 "nothing to train"),
    "dcn_v2": "its reader's log(x + 1) applied to the dense values",
    "deepfefm": "its reader's clipping to [0, 1] applied; the start line says where its net differs",
    "autoint": "its sample read as `idx_value`",
    "flen": "its `avazu_reader` lines read as `avazu`, fields in 13 + 3 + 6 groups",
    "fat_deepffm": "async; its 71 MB dense table travels every step unless `runner.dense_sync_steps`",
}


def fail(msg):
    print(f"sweep_table.py: {msg}", file=sys.stderr)
    sys.exit(2)


def parse(text, path="TSV"):
    """(header dict, rows) of a sweep's TSV; rows are dicts of config, family, outcome, network,
    detail in the file's order."""
    header, rows = {}, []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            key, sep, value = line[1:].partition(":")
            if sep:
                header[key.strip()] = value.strip()
            continue
        cols = line.split("\t")
        if len(cols) != 4 or cols[1] not in OUTCOMES:
            fail(f"{path}:{n}: not a sweep row (config, trains/loads/refused, network, detail)")
        config, outcome, network, detail = cols
        rows.append({"config": config, "family": config.split("/")[0], "outcome": outcome,
                     "network": network, "detail": detail})
    if not rows:
        fail(f"{path}: no rows")
    return header, rows


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def short(text):
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS - 1].rstrip() + "…"


def groups(rows):
    """[(families, note, rows)]: the families in order of first appearance, those with the same
    note in one group (the group placed where its first family is)."""
    order, by_note = [], {}
    for r in rows:
        note = NOTES.get(r["family"], "")
        if note not in by_note:
            by_note[note] = ([], [])
            order.append(note)
        families, members = by_note[note]
        if r["family"] not in families:
            families.append(r["family"])
        members.append(r)
    return [(by_note[n][0], n, by_note[n][1]) for n in order]


def summary(header, rows):
    count = {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES}
    paddle = header.get("paddle", "unknown")
    where = (f"GPUBox {header.get('gpubox', '?')}, PaddleRec {header.get('paddlerec', '?')}, "
             f"Paddle {paddle}")
    if paddle == "not importable":
        where += ", so GPUBox read the files itself"
    took = f" in {header['seconds']} s" if header.get("seconds") else ""
    return (f"Last run on {header.get('date', '?')} ({where}){took}: {len(rows)} configs, "
            f"{count['trains']} train, {count['loads']} load only, {count['refused']} refused.")


def render(header, rows):
    lines = [summary(header, rows), "",
             "| family | configs | train unchanged | the others, and why (the sweep's words) | note |",
             "|---|---:|---:|---|---|"]
    for families, note, members in groups(rows):
        others = [f"`{r['config']}` {r['outcome']}: {short(r['detail'])}"
                  for r in members if r["outcome"] != "trains"]
        trains = sum(r["outcome"] == "trains" for r in members)
        lines.append(f"| {', '.join(families)} | {len(members)} | {trains} | "
                     f"{cell('; '.join(others)) or '—'} | {cell(note) or '—'} |")
    return "\n".join(lines) + "\n"


def table_in(text, path):
    b, e = text.find(BEGIN), text.find(END)
    if b < 0 or e < b:
        fail(f"{path} has no '{BEGIN.strip()}' ... '{END}' markers")
    return b + len(BEGIN), e


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tsv", default=TSV, help="the sweep's output (default %(default)s)")
    ap.add_argument("--readme", default=README, help="the file with the markers (default %(default)s)")
    ap.add_argument("--write", action="store_true", help="write the table into --readme")
    ap.add_argument("--check", action="store_true", help="exit 1 when --readme's table is stale")
    a = ap.parse_args(argv)
    try:
        with open(a.tsv) as fh:
            table = render(*parse(fh.read(), a.tsv))
    except OSError as e:
        fail(f"cannot read the sweep's TSV: {e}")
    if not (a.write or a.check):
        sys.stdout.write(table)
        return 0
    with open(a.readme) as fh:
        text = fh.read()
    b, e = table_in(text, a.readme)
    if a.check:
        if text[b:e] != table:
            print(f"sweep_table.py: {a.readme}'s PaddleRec table is not what {a.tsv} renders: "
                  "run scripts/sweep_table.py --write", file=sys.stderr)
            return 1
        return 0
    with open(a.readme, "w") as fh:
        fh.write(text[:b] + table + text[e:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
