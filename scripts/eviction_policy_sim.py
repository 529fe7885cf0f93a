#!/usr/bin/env python3
"""Which rows should the host tier keep in memory under runner.host_memory_mb? (issue 15)

Replays a pass-structured key stream drawn like `gpubox_data gen --key_sampler closed_form`
(power-law ranks, exponent --zipf, --vocab keys) through a memory of --budget keys. At the end
of each pass the memory keeps the --budget keys ranked highest by the policy and the rest go to
disk; the cost of a policy is the disk reads of the next pass: keys that exist already but are
not in memory. Policies:
  score    the host tier's: Paddle's CTR score nonclk_coeff*(show-click) + clk_coeff*click, show
           and click decayed by show_click_decay_rate each pass (configs/config_gpubox.yaml's
           0.1, 1.0, 0.98), ties by recency
  recency  least recently seen pass goes first (LRU at pass granularity)
Clicks: each key has its own click rate (a hash of the key, mean --ctr).
Prints one line per policy: disk reads per pass after the warm-up, and their share of the keys.
"""
import argparse
import math
import random


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=float, default=1e6)
    ap.add_argument("--zipf", type=float, default=0.9)
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--draws", type=float, default=2e5, help="key draws per pass")
    ap.add_argument("--budget", type=float, default=0.25, help="memory keys, as a share of the vocabulary")
    ap.add_argument("--ctr", type=float, default=0.25)
    ap.add_argument("--drift", type=float, default=0.0,
                    help="share of the vocabulary the popularity ranking shifts by each pass (trending keys)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    vocab, draws, budget = int(a.vocab), int(a.draws), int(a.budget * a.vocab)
    om = 1.0 - a.zipf
    top = math.log(vocab + 1.0)
    term = math.expm1(om * top)

    def rank(u):
        x = math.exp(u * top if abs(om) < 1e-12 else math.log1p(u * term) / om)
        return min(vocab - 1, max(0, int(x) - 1))

    rng = random.Random(a.seed)
    stream = []
    for p in range(a.passes):
        shift = int(p * a.drift * vocab)
        stream.append([(rank(rng.random()) + shift) % vocab for _ in range(draws)])
    click_rate = {}

    def clicked(key):
        r = click_rate.get(key)
        if r is None:
            r = click_rate[key] = min(1.0, random.Random(key * 7919 + a.seed).expovariate(1.0 / a.ctr))
        return rng.random() < r

    for policy in ("score", "recency"):
        show, click, last = {}, {}, {}
        memory = set()
        reads, keys_seen = 0, 0
        for p, keys in enumerate(stream):
            distinct = set(keys)
            if p >= 2:  # after the warm-up
                reads += sum(1 for k in distinct if k in last and k not in memory)
                keys_seen += len(distinct)
            for k in show:
                show[k] *= 0.98
                click[k] *= 0.98
            for k in keys:
                show[k] = show.get(k, 0.0) + 1.0
                click[k] = click.get(k, 0.0) + (1.0 if clicked(k) else 0.0)
                last[k] = p
            if policy == "score":
                rank_of = lambda k: (0.1 * (show[k] - click[k]) + click[k], last[k])
            else:
                rank_of = lambda k: last[k]
            memory = set(sorted(last, key=rank_of, reverse=True)[:budget])
        print("%-8s disk reads per pass %.0f = %.1f%% of the pass's keys (vocab %d, zipf %.2f, "
              "budget %d keys, drift %.3f)" % (policy, reads / max(1, a.passes - 2),
                                              100.0 * reads / max(1, keys_seen), vocab, a.zipf,
                                              budget, a.drift))


if __name__ == "__main__":
    main()
