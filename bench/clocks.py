#!/usr/bin/env python3
"""clocks.py — each backend of compare_torch.py in sustained loops, with
the SM clock and the board power sampled beside them.

The H200 runs these backwards at its power limit (~690 W of 700), where
the SM clock follows the energy a kernel spends: two kernels that tie when
run alone (ncu) can differ by several percent in a loop. This script takes
compare_torch.py's cases and setup (same tensors, same checks) and, instead
of its event-timed bursts, calls each backend back to back for --seconds
(default 2.5) while `nvidia-smi` samples clocks.sm and power.draw every 50
ms; the backends take turns in --rounds rounds (default 3), each round
starting with the next one. Per backend and round it prints TFLOP/s over
the whole loop, the median SM clock (MHz) and power (W) of the samples
taken inside it, and the energy of one backward (J = W x s).

  python3 bench/clocks.py --lib build/libsdpa_jit.so --hd 128 --seq 2048 \\
      [--dtype bf16|fp16] [--memory bhsd|bshd] [--seconds S] [--rounds R]

Every compare_torch.py option that picks cases is accepted (--hd, --seq,
--dtype, --memory, --quick, --more-head-dims). Needs a GPU, PyTorch and
nvidia-smi (PyTorch without a GPU: "skipped: no CUDA device", exit 77).
"""
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch  # noqa: E402

SECONDS = 2.5


def sampled_loop(fn, seconds):
    """Calls fn() back to back for about `seconds` under an nvidia-smi
    sampler; returns (milliseconds a call, median MHz, median W)."""
    import torch
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw",
                            "--format=csv,noheader,nounits", "-lms", "50", "-i",
                            str(torch.cuda.current_device())],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(0.2)  # the sampler's first line before the loop
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.monotonic()
    start.record()
    calls = 0
    while time.monotonic() - t0 < seconds:
        for _ in range(4):
            fn()
        calls += 4
        torch.cuda.synchronize()  # keeps the host within a few calls of the GPU
    end.record()
    torch.cuda.synchronize()
    time.sleep(0.1)
    smi.terminate()
    out, _ = smi.communicate()
    samples = []
    for line in out.strip().splitlines():
        try:
            mhz, watts = (float(x) for x in line.split(","))
            samples.append((mhz, watts))
        except ValueError:
            continue
    inside = samples[4:-2] if len(samples) > 8 else samples  # drop the edges
    mhz = statistics.median(s[0] for s in inside) if inside else float("nan")
    watts = statistics.median(s[1] for s in inside) if inside else float("nan")
    return start.elapsed_time(end) / calls, mhz, watts


def main():
    """compare_torch.main() with its timer swapped for sampled loops: its
    time_rounds still takes the backends in turn, each call of the timer
    one loop of the backend it is handed."""
    global SECONDS
    args = sys.argv[1:]
    if "--seconds" in args:
        i = args.index("--seconds")
        SECONDS = float(args[i + 1])
        del args[i:i + 2]
    current = {}
    time_rounds, grid = compare_torch.time_rounds, compare_torch.grid

    def rounds(fns, runs, timer, rounds_):
        names = {id(fn): name for name, fn in fns.items()}
        loops = {name: 0 for name in fns}

        def sampled(fn, runs_):
            name = names[id(fn)]
            loops[name] += 1
            ms, mhz, watts = sampled_loop(fn, SECONDS)
            flops = compare_torch.case_flops(current["case"])
            print(f"  {current['case']['name']:<30} round {loops[name]} {name:<6} "
                  f"{flops / (ms * 1e-3) / 1e12:7.1f} TFLOP/s  {mhz:6.0f} MHz  {watts:6.1f} W  "
                  f"{watts * ms * 1e-3:7.3f} J a call", flush=True)
            return ms

        return time_rounds(fns, runs, sampled, rounds_)

    def tagged_grid(a):
        for c in grid(a):
            current["case"] = c
            yield c

    compare_torch.time_rounds = rounds
    compare_torch.grid = tagged_grid
    sys.argv = [sys.argv[0]] + args
    return compare_torch.main()

if __name__ == "__main__":
    sys.exit(main())
