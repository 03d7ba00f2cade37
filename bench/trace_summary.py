#!/usr/bin/env python3
"""trace_summary.py — where a block's time goes in the sm_90a main kernel,
from the per-block stamps `bench_hopper --trace DIR` writes (one CSV per
timed case; the slots are documented at SDPA_HOPPER_TRACE in
templates/sdpa_hopper.cuh).

    python3 bench/trace_summary.py DIR/*.csv

Per case: the kernel's span (globaltimer), then each SM's time split into
prologue (entry to K in, consumer 0), loop (its steps), the last dQ
send and bulk wait, the dK / dV stores, the gap to the SM's next block
(block exit, launch, empty blocks), and the SM's idle time after its last
block (the tail). Times within an SM come from its clock (the same
counter for all its blocks), converted with the clock rate measured from
the blocks' globaltimer spans.
"""
import csv
import statistics
import sys
from collections import defaultdict


def load(path):
    with open(path) as f:
        return [{k: int(v) for k, v in row.items()} for row in csv.DictReader(f)]


def summary(path):
    rows = load(path)
    work = [r for r in rows if r["steps"] > 0 and r["clk_store"] > r["clk_entry"]]
    if not work:
        return f"{path}: no block with work"
    # ns per clock from the blocks' own spans (entry to consumer 0's end)
    rates = [(r["gt_end"] - r["gt_entry"]) / (r["clk_store"] - r["clk_entry"])
             for r in work if r["gt_end"] > r["gt_entry"]]
    ns = statistics.median(rates)
    span = (max(r["gt_end"] for r in work) - min(r["gt_entry"] for r in rows)) / 1e3  # us
    by_sm = defaultdict(list)
    for r in rows:
        by_sm[r["smid"]].append(r)
    part = dict(prologue=0.0, loop=0.0, last_dq=0.0, store=0.0, gap=0.0)
    steps = 0
    for blocks in by_sm.values():
        blocks.sort(key=lambda r: r["clk_entry"])
        end = None
        for r in blocks:
            if end is not None:
                part["gap"] += max(0, r["clk_entry"] - end)
            if r["steps"] > 0:
                part["prologue"] += r["clk_kv"] - r["clk_entry"]
                part["loop"] += r["clk_loop"] - r["clk_kv"]
                part["last_dq"] += r["clk_bulk"] - r["clk_loop"]
                part["store"] += max(r["clk_store"], r["clk_store1"]) - r["clk_bulk"]
                steps += r["steps"]
                end = max(r["clk_store"], r["clk_store1"])
            else:
                end = r["clk_entry"]
    sms = len(by_sm)
    busy = sum(part.values()) * ns / 1e3
    total = span * sms
    lines = [f"{path}: span {span:.1f} us on {sms} SMs, {len(work)} blocks with work "
             f"({len(rows) - len(work)} without), {steps} steps, clock {1 / ns:.3f} GHz"]
    for k, v in part.items():
        us = v * ns / 1e3
        lines.append(f"  {k:9s} {us / sms:9.1f} us per SM  {100 * us / total:5.1f}%")
    lines.append(f"  {'tail':9s} {(total - busy) / sms:9.1f} us per SM  {100 * (total - busy) / total:5.1f}%")
    per_step = part["loop"] * ns / 1e3 / max(steps, 1)
    per_block = {k: part[k] * ns / 1e3 / len(work) for k in ("prologue", "last_dq", "store")}
    gaps = part["gap"] * ns / 1e3 / max(len(rows) - sms, 1)
    lines.append(f"  per step {per_step:.2f} us; per block: prologue {per_block['prologue']:.2f} us, "
                 f"last dQ {per_block['last_dq']:.2f} us, stores {per_block['store']:.2f} us; "
                 f"gap before a block {gaps:.2f} us")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        print(summary(p))
