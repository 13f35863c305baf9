#!/usr/bin/env python3
"""Bounds on prompt lookup for a workload: replays greedy outputs through n-gram proposers.

Fetches each prompt's greedy completion from a running `tokenmill serve` (speculation off or
on: greedy output is the same), re-tokenizes prompt + completion with its `/tokenize`, then
walks every output position as the engine would: a proposer offers up to K drafts, the
accepted ones are the prefix that matches the real output, a step advances by accepted + 1.
A step costs T1 + drafts verified * C (ms; defaults from a served profile on a Zen 5 machine,
BENCHMARKS.md), and the speed-up is tokens * T1 / total time. Two policies: verify every draft
the proposer offers, and an oracle that verifies exactly the drafts that will be accepted
(what no draft-count rule can beat for that proposer). And the engine's adaptive rule
(crates/engine/src/spec/adaptive.rs) over the shipped proposer with that price of a row: one
acceptance rate per request (shipped), or a rate per class of proposal (a match of n tokens,
or one continuing a proposal whose drafts all held: measured in the engine and not shipped,
BENCHMARKS.md, 2026-12-07).

Usage: scripts/spec-replay.py [--url http://127.0.0.1:8000] [--model m]
           [--dataset scripts/data/spec-edit-prompts.jsonl] [--t1 3.56] [--c 0.49]
"""
import argparse
import json
import urllib.request


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.load(r)


def lookup(seq, lo=2, hi=4):
    """The shipped proposer's match, the latest earlier match of the last hi..lo tokens:
    (n, index the proposal starts at), or None."""
    n_tok = len(seq)
    for n in range(min(hi, n_tok - 1), lo - 1, -1):
        pat = seq[n_tok - n:]
        for s in range(n_tok - n - 1, -1, -1):
            if seq[s:s + n] == pat:
                return n, s + n
    return None


def latest_match(seq, k, lo=2, hi=4):
    """The shipped proposer: what followed its match."""
    m = lookup(seq, lo, hi)
    return [seq[m[1]:m[1] + k]] if m else []


def agreed(cand, seq, pos):
    """How many of the drafts `cand` for positions pos, pos + 1, ... the output agrees with."""
    a = 0
    while a < len(cand) and pos + a < len(seq) and cand[a] == seq[pos + a]:
        a += 1
    return a


def longest_match(seq, k, lo=2, hi=64):
    """The earlier position whose preceding tokens match the sequence's end the longest."""
    n_tok, best, best_len = len(seq), None, 0
    for e in range(n_tok - 1, 0, -1):
        m = 0
        while m < hi and e - 1 - m >= 0 and seq[e - 1 - m] == seq[n_tok - 1 - m]:
            m += 1
        if m > best_len:
            best, best_len = e, m
    return [seq[best:best + k]] if best_len >= lo else []


def two_latest(seq, k, lo=2, hi=4):
    """A tree of two: the latest matches (longest n first) with different next tokens."""
    n_tok, out, firsts = len(seq), [], set()
    for n in range(min(hi, n_tok - 1), lo - 1, -1):
        pat = seq[n_tok - n:]
        for s in range(n_tok - n - 1, -1, -1):
            if seq[s:s + n] == pat:
                c = seq[s + n:s + n + k]
                if c and c[0] not in firsts:
                    firsts.add(c[0])
                    out.append(c)
                    if len(out) == 2:
                        return out
        if out:
            return out
    return out


def adaptive(data, k, t1, c, by_class):
    """The engine's rule for one stream: threshold c / t1; a draft j is verified while
    rate^j clears it; rates are the request's decayed record smoothed toward the engine's
    (per class or one); a proposal not verified is a guess that the next token settles,
    and every 8th such step verifies one draft (a probe)."""
    thr, engine = c / t1, {}
    tokens = time = 0.0
    for prompt_len, seq in data:
        own, pos, cont_at, idle = {}, prompt_len, None, 0
        while pos < len(seq):
            m = lookup(seq[:pos])
            take, cls = 0, None
            if m:
                n, src = m
                cls = ("cont" if src == cont_at else n) if by_class else "all"
                ea, ev = engine.get(cls, (0, 0))
                e = (ea + 4 * 0.7) / (ev + 4)
                w = 16 if by_class else 4
                oa, ov = own.get(cls, (0.0, 0.0))
                rate, chance = (oa + w * e) / (ov + w), 1.0
                while take < min(k, len(seq) - src):
                    chance *= rate
                    if chance <= thr:
                        break
                    take += 1
                if take == 0:
                    idle += 1
                    if idle >= 8:
                        idle, take = 0, 1
            cont_at = None
            cand = seq[m[1]:m[1] + take] if m else []
            a = agreed(cand, seq, pos)
            oa, ov = own.get(cls, (0.0, 0.0))
            if cand:
                idle = 0
                own[cls] = (oa * 0.9 + a, ov * 0.9 + len(cand))
                ea, ev = engine.get(cls, (0, 0))
                engine[cls] = (ea + a, ev + len(cand))
                if a == len(cand):
                    cont_at = m[1] + a + 1
            elif m:  # a guess: the next token settles it
                held = pos < len(seq) and seq[m[1]] == seq[pos]
                own[cls] = (oa * 0.97 + held, ov * 0.97 + 1)
                ea, ev = engine.get(cls, (0, 0))
                engine[cls] = (ea + held, ev + 1)
                cont_at = m[1] + 1 if held else None
            step = min(a + 1, len(seq) - pos)
            pos += step
            tokens += step
            time += t1 + len(cand) * c
    return tokens * t1 / time


def by_class(data, k):
    """Every draft of the shipped proposer verified, split by where the proposal came from: a
    fresh match of n tokens, or one continuing a proposal whose drafts all held (its source
    is where that one's goes on). Rows: (class, steps, mean drafts accepted, first draft
    accepted)."""
    stats = {}
    for prompt_len, seq in data:
        pos, cont_at = prompt_len, None
        while pos < len(seq):
            m = lookup(seq[:pos])
            if not m:
                pos, cont_at = pos + 1, None
                continue
            n, src = m
            cand = seq[src:src + k]
            a = agreed(cand, seq, pos)
            cls = "continuing" if src == cont_at else f"fresh {n}-token match"
            steps, acc, first = stats.get(cls, (0, 0, 0))
            stats[cls] = (steps + 1, acc + a, first + (a > 0))
            step = min(a + 1, len(seq) - pos)
            cont_at = src + step if a == len(cand) else None
            pos += step
    return [(cls, s, acc / s, first / s) for cls, (s, acc, first) in sorted(stats.items())]


def replay(data, proposer, k, oracle, t1, c):
    tokens = time = 0.0
    for prompt_len, seq in data:
        pos = prompt_len
        while pos < len(seq):
            best = rows = 0
            for cand in proposer(seq[:pos], k):
                a = agreed(cand, seq, pos)
                best = max(best, a)
                rows += len(cand)
            if oracle:
                rows = best
            step = min(best + 1, len(seq) - pos)
            pos += step
            tokens += step
            time += t1 + rows * c
    return tokens * t1 / time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="m")
    ap.add_argument("--dataset", default="scripts/data/spec-edit-prompts.jsonl")
    ap.add_argument("--t1", type=float, default=3.56, help="ms of a one-row step")
    ap.add_argument("--c", type=float, default=0.49, help="ms of each verified draft")
    ap.add_argument("--k", type=int, default=8, help="drafts a step at most")
    args = ap.parse_args()
    data = []
    for line in open(args.dataset):
        p = json.loads(line)
        r = post(args.url, "/v1/completions", {"model": args.model, "prompt": p["prompt"],
                                               "max_tokens": p.get("output_len", 128),
                                               "temperature": 0})
        text = r["choices"][0]["text"]
        prompt = post(args.url, "/tokenize", {"model": args.model, "prompt": p["prompt"]})["tokens"]
        full = post(args.url, "/tokenize", {"model": args.model, "prompt": p["prompt"] + text})["tokens"]
        data.append((len(prompt), full))
    print(f"{len(data)} prompts; a step costs {args.t1} ms + {args.c} ms a draft; k <= {args.k}")
    print(f"{'proposer':<44} {'verify all':>10} {'oracle':>8}")
    for name, prop in [("latest match of the last 4..2 tokens (shipped)", latest_match),
                       ("longest context match, min 2", longest_match),
                       ("longest context match, min 1", lambda s, k: longest_match(s, k, 1)),
                       ("two candidates (a tree)", two_latest)]:
        print(f"{name:<44} {replay(data, prop, args.k, False, args.t1, args.c):>9.2f}x "
              f"{replay(data, prop, args.k, True, args.t1, args.c):>7.2f}x")
    for name, classes in [("adaptive, one rate a request (shipped)", False),
                          ("adaptive, a rate per class (not shipped)", True)]:
        print(f"{name:<44} {adaptive(data, args.k, args.t1, args.c, classes):>9.2f}x")
    print(f"\nshipped proposer, every draft verified (k <= {args.k}), by where proposals came from:")
    print(f"{'proposal':<28} {'steps':>6} {'accepted':>9} {'first held':>11}")
    for cls, steps, acc, first in by_class(data, args.k):
        print(f"{cls:<28} {steps:>6} {acc:>9.2f} {first:>10.0%}")


if __name__ == "__main__":
    main()
