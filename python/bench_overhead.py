#!/usr/bin/env python3
"""bench_overhead.py -- host time of sdpa_jit.torch's backward call against
the bare ctypes sdpa_bwd_execute it wraps.

On a GPU machine with PyTorch: one small problem (B 1, H 2, S 128, D 64,
bf16, so the GPU keeps up with the host), its forward run once, then, each
timed over rounds of N back-to-back calls with the host clock (the device
is synchronized between rounds, outside the timed part; median of the
rounds):

  bare       lib.sdpa_bwd_execute(plan, &tensors, workspace, bytes, stream)
             with every argument made beforehand: the C call itself
  into       the wrapper's plan lookup and execute on outputs given to it:
             key from shapes and strides, dict lookup, workspace from the
             caching allocator, the tensors struct, the current stream,
             execute (sdpa_jit.torch._backward_into)
  backward   the op's whole backward implementation: also allocates dQ, dK,
             dV (sdpa_jit.torch._backward_dense)
  autograd   out.backward(dO): PyTorch's autograd engine calling it, through
             the eager autograd.Function and through the custom op

Python overhead = into - bare (plan lookup + execute), and backward - bare
(with the three output allocations); the goal is <= 20 us.

  python3 python/bench_overhead.py [--rounds 30] [--calls 100] [--json FILE]
"""
import argparse
import ctypes
import json
import statistics
import sys
import time


def timed(fn, rounds, calls, sync):
    """Median microseconds of one fn() over `rounds` rounds of `calls`."""
    for _ in range(3):
        fn()
    sync()
    per = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - start) / calls * 1e6)
        sync()
    return statistics.median(per)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--json")
    ap.add_argument("--goal-us", type=float, default=20.0)
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 77
    import sdpa_jit
    import sdpa_jit.torch as st

    b, h, s, d = 1, 2, 128, 64
    q, k, v, dout = (torch.randn(b, h, s, d, dtype=torch.bfloat16, device="cuda") for _ in range(4))
    mask, wl, wr = st._resolve_mask("bench", "top_left", None, True)
    scale = d ** -0.5
    params = (mask, wl, wr, scale, False)
    out, lse = st._forward_dense(q, k, v, mask, wl, wr, scale)
    dq, dk, dv = st._backward_dense(dout, q, k, v, out, lse, *params)  # makes and compiles the plan
    torch.cuda.synchronize()
    (entry,) = st._plans.values()

    # bare: the C call with everything made beforehand
    lib = sdpa_jit.library()
    execute = lib.sdpa_bwd_execute
    workspace = torch.empty(entry.workspace_bytes, dtype=torch.uint8, device="cuda")
    tensors = sdpa_jit.BwdTensors.init(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=out.data_ptr(),
                                       dout=dout.data_ptr(), lse=lse.data_ptr(), dq=dq.data_ptr(),
                                       dk=dk.data_ptr(), dv=dv.data_ptr())
    ref = ctypes.byref(tensors)
    stream = torch.cuda.current_stream().cuda_stream
    handle, ws, nbytes = entry.handle, workspace.data_ptr(), entry.workspace_bytes
    assert execute(handle, ref, ws, nbytes, stream) == 0, lib.sdpa_last_error()

    def bare():
        execute(handle, ref, ws, nbytes, stream)

    def into():
        st._backward_into(False, dout, q, k, v, out, lse, dq, dk, dv, None, None, 0, 0, params)

    def backward():
        st._backward_dense(dout, q, k, v, out, lse, *params)

    qa, ka, va = (x.clone().requires_grad_() for x in (q, k, v))

    def autograd_function():
        o = st.attention(qa, ka, va, causal="top_left")
        o.backward(dout)

    def forward_only():
        with torch.no_grad():
            st.attention(qa, ka, va, causal="top_left")

    sync = torch.cuda.synchronize
    rows = {}
    rows["bare ctypes execute"] = timed(bare, args.rounds, args.calls, sync)
    rows["lookup + execute (into)"] = timed(into, args.rounds, args.calls, sync)
    rows["backward (+ dq/dk/dv alloc)"] = timed(backward, args.rounds, args.calls, sync)
    rows["forward op (no grad)"] = timed(forward_only, args.rounds, args.calls, sync)
    rows["fwd+bwd, autograd.Function"] = timed(autograd_function, args.rounds, args.calls, sync)
    st.eager_function = False
    try:
        rows["fwd+bwd, custom op"] = timed(autograd_function, args.rounds, args.calls, sync)
    finally:
        st.eager_function = True

    def torch_sdpa():
        o = torch.nn.functional.scaled_dot_product_attention(qa, ka, va, is_causal=True)
        o.backward(dout)

    rows["fwd+bwd, F.scaled_dot_product_attention"] = timed(torch_sdpa, args.rounds, args.calls, sync)

    bare_us = rows["bare ctypes execute"]
    lookup = rows["lookup + execute (into)"] - bare_us
    with_alloc = rows["backward (+ dq/dk/dv alloc)"] - bare_us
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; sdpa-jit "
          f"{sdpa_jit.library_version()}; problem B{b} H{h} S{s} D{d} bf16 causal; "
          f"median of {args.rounds} rounds x {args.calls} calls, host time")
    for name, us in rows.items():
        print(f"  {name:<42} {us:8.2f} us")
    ok = lookup <= args.goal_us
    print(f"Python overhead of one backward call (plan lookup + execute): {lookup:.2f} us "
          f"({'<=' if ok else '>'} {args.goal_us:g} us goal: {'PASS' if ok else 'FAIL'}); "
          f"with the dq/dk/dv allocations: {with_alloc:.2f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows_us": rows, "overhead_us": lookup, "overhead_with_alloc_us": with_alloc,
                       "goal_us": args.goal_us, "pass": ok}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
