#!/usr/bin/env python3
"""Paddle InMemoryDataset pipe_command: GPUBox slot text on stdin -> Paddle MultiSlot text on stdout.

  python3 slot_to_multislot.py --slots 26 --dense 13 --table_rows R < part-00000

Input line (gpubox_data gen / PaddleRec slot format, "slot:feasign" order):
  click:0 dense_feature:0.34 ... dense_feature:0.12 1:10 2:100052 ... 26:2500001
Output line, one group per use_var in this order: click, dense_feature, 1 .. <slots>:
  1 <click> <dense> d1 .. d<dense> <n1> k .. <n2> k ..
or in the order --fields names (label, dense and slot numbers: "label,1,2,..,26,dense" for
PaddleRec's criteo networks, whose feeds are label, C1 .. C26, dense_input; or label, feat_index
and feat_value for its autoint and logistic_regression, whose criteo readers give each line one
index and one value per field: dense field d (1 .. <dense>) as index d with its value, then each
slot's first key with value 1, as index key % table_rows + <dense>, so that no key shares a
dense field's row (generated keys start at 1: slot 1's most frequent keys are 1 .. 13), as
PaddleRec's criteo data number the categorical indices after the dense ones; the table then
needs table_rows + <dense> rows).
Each key becomes key % table_rows (Paddle's static embedding is a fixed-size table). A slot with
no key gets the single key 0, because Paddle's MultiSlot feed rejects an empty slot; GPUBox pools
an empty slot to zeros instead (generated data never has one). A line that cannot be parsed is
written to stderr and dropped, and counted in the exit message.
"""
import argparse
import sys

NAMED = ("label", "dense", "feat_index", "feat_value")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--slots", type=int, default=26)
    ap.add_argument("--dense", type=int, default=13)
    ap.add_argument("--table_rows", type=int, required=True)
    ap.add_argument("--label", default="click")
    ap.add_argument("--dense_name", default="dense_feature")
    ap.add_argument("--fields", default="", help="output order: label, dense, slot numbers")
    a = ap.parse_args()
    if a.slots <= 0 or a.dense <= 0 or a.table_rows <= 0:
        sys.exit("slot_to_multislot: --slots, --dense and --table_rows must be positive")
    names = {str(s): s - 1 for s in range(1, a.slots + 1)}
    order = ["label", "dense"] + list(range(a.slots))
    if a.fields:
        order = [f if f in NAMED else names.get(f) for f in a.fields.split(",")]
        every_slot = len(order) == a.slots + 2 and "dense" in order
        by_field = sorted(map(str, order)) == ["feat_index", "feat_value", "label"]
        if None in order or len(set(map(str, order))) != len(order) or not (
                every_slot or by_field) or "label" not in order:
            sys.exit("slot_to_multislot: --fields '%s' must name label, dense and slots 1 .. %d "
                     "once each, or label, feat_index and feat_value" % (a.fields, a.slots))
    label_prefix = a.label + ":"
    dense_prefix = a.dense_name + ":"
    rows = a.table_rows
    out = sys.stdout
    bad = 0
    for lineno, line in enumerate(sys.stdin, 1):
        toks = line.split()
        if not toks:
            continue
        label = None
        dense = []
        keys = [[] for _ in range(a.slots)]
        ok = True
        for t in toks:
            if t.startswith(dense_prefix):
                dense.append(t[len(dense_prefix):])
            elif t.startswith(label_prefix):
                label = t[len(label_prefix):]
            else:
                slot, sep, key = t.partition(":")
                idx = names.get(slot)
                if not sep or idx is None or not key.isdigit():
                    ok = False
                    break
                keys[idx].append(str(int(key) % rows))
        if not ok or label not in ("0", "1") or len(dense) != a.dense:
            bad += 1
            print("slot_to_multislot: dropped malformed line %d: %.80s" % (lineno, line.strip()),
                  file=sys.stderr)
            continue
        parts = []
        for f in order:
            if f == "label":
                parts.extend(("1", label))
            elif f == "dense":
                parts.append(str(a.dense))
                parts.extend(dense)
            elif f == "feat_index":
                parts.append(str(a.dense + a.slots))
                parts.extend(str(d) for d in range(1, a.dense + 1))
                parts.extend(str(int((k or ["0"])[0]) + a.dense) for k in keys)
            elif f == "feat_value":
                parts.append(str(a.dense + a.slots))
                parts.extend(dense)
                parts.extend("1" for _ in keys)
            else:
                k = keys[f] or ["0"]
                parts.append(str(len(k)))
                parts.extend(k)
        out.write(" ".join(parts))
        out.write("\n")
    if bad:
        print("slot_to_multislot: %d malformed line(s) dropped" % bad, file=sys.stderr)


if __name__ == "__main__":
    main()
