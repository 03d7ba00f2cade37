#!/usr/bin/env python3
"""compare_torch.py — sdpa-jit's backward side by side with PyTorch's.

In one process on a GPU machine with PyTorch: loads libsdpa_jit.so with
ctypes (through the Python package's mirror of include/sdpa_jit.h), makes
the tensors with torch, runs torch.nn.functional.scaled_dot_product_attention
forward with requires_grad under the FLASH_ATTENTION and CUDNN_ATTENTION
backends, and times the backward of each backend and of sdpa-jit with
torch.cuda.Event (median of >= 20 runs after warm-up, in --rounds rounds
that take the backends in turn, each round starting with the next one;
the median of the rounds' medians). sdpa-jit gets
PyTorch's own tensors (data_ptr() and their strides: torch's [B, H, S, D]
is just another set of BSHD strides), the LSE computed in torch (fp32,
chunked logsumexp of the scaled scores), flash's O, and PyTorch's current
stream. Its gradients are checked against flash's, or cuDNN's where flash
refuses the case (relative error
||ours - flash|| / ||flash||: bf16 <= 1e-2, fp16 <= 4e-3, which is twice
each implementation's own fp16 tolerance of 2e-3 against float64).

TFLOP/s = 2 * B * H * Sq * Skv * (3 D + 2 DV) / time (4 * 2.5 * D when
DV = D), halved for causal; the grid is bench_bwd's (bf16 first), and with
--more-head-dims head dims 80, 96, 112, 160, 192, 256 and 192/128 at S 4k
and 8k, and GQA 16/2 at hd 192 and 256, S 8k. Each row names the family that ran (mma or hopper). GQA runs torch with enable_gqa=True, or,
where a backend refuses it, with K/V expanded by repeat_interleave (marked
'*': that backward includes the group sum). THD runs torch's flash on nested
(jagged) tensors (cuDNN has no nested-tensor path: 'n/a').

--memory picks the BSHD cases' memory order: bhsd (default: contiguous
[B, H, S, D] tensors) or bshd (contiguous [B, S, H, D] viewed as
[B, H, S, D], as after a projection and a transpose).

--small runs bench_bwd --small's problems instead (B 1, H 16, S 500 to
1024: most of them small grids),
timed with --graph: each backward (PyTorch's autograd call, or ours)
captured in a CUDA graph and replayed back to back, since at 30-70 us a
backward the host-side dispatch of either would be what is timed.

  python3 bench/compare_torch.py --lib build/libsdpa_jit.so [--quick | --small]
      [--dtype bf16|fp16] [--hd D[,D...]] [--more-head-dims] [--seq S] [--memory bhsd|bshd]
      [--graph] [--runs N] [--rounds R] [--csv FILE]

Why rounds: the H200 runs these backwards at its power limit (~690 W,
SM clock 1.74-1.80 GHz), and a backend timed in a burst of ~60 ms right
after an idle gap runs at a higher clock than the one timed after it
(measured: hd 128 S4k full, 2.5 s loops of each, ours 519 against cuDNN's
506 TFLOP/s; one burst each in the fixed order flash, cuDNN, ours: 520
against 545). Taking the backends in turn removes the order's bias.
"""
import argparse
import ctypes
import math
import os
import statistics
import sys

# ----------------------------------------------------------- sdpa_jit.h
# The structs and prototypes are the Python package's mirror of the header
# (python/sdpa_jit/_capi.py): one copy of the ABI in the tree.

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from sdpa_jit import _capi  # noqa: E402
from sdpa_jit._capi import (BwdDesc, BwdPlanInfo, BwdTensors, Dtype, Family,  # noqa: E402
                            Layout, LseStrides, Mask, Strides)


class SdpaJit:
    """The library, loaded from a path, and the few calls this script makes."""

    def __init__(self, path):
        self.lib = _capi.load_library(path)

    def check(self, status, what):
        _capi.check(status, what, self.lib)

    def runtime(self):
        rt = ctypes.c_void_p()
        self.check(self.lib.sdpa_runtime_create(ctypes.byref(rt), None), "sdpa_runtime_create")
        return rt

    def plan(self, runtime, desc):
        plan = ctypes.c_void_p()
        self.check(self.lib.sdpa_bwd_plan_create(ctypes.byref(plan), runtime, ctypes.byref(desc)),
                   "sdpa_bwd_plan_create")
        source = _capi.c_enum(0)
        status = self.lib.sdpa_bwd_compile(plan, ctypes.byref(source))
        if status != 0:
            log = (self.lib.sdpa_bwd_plan_compile_log(plan) or b"").decode(errors="replace")
            self.lib.sdpa_bwd_plan_destroy(plan)
            self.check(status, "sdpa_bwd_compile\n" + log[:2000])
        return plan

    def family(self, plan):
        """The family the plan chose ("mma" or "hopper")."""
        info = BwdPlanInfo.init()
        self.check(self.lib.sdpa_bwd_plan_query(plan, ctypes.byref(info)), "sdpa_bwd_plan_query")
        return "hopper" if info.family == Family.HOPPER else "mma"


# --------------------------------------------------------------- torch


def bshd_strides(t):
    """BSHD element strides of a [B, H, S, D] torch tensor (last dim contiguous)."""
    assert t.stride(3) == 1, "the last dim must be contiguous"
    return Strides(t.stride(0), t.stride(2), t.stride(1))


def thd_strides(t):
    """THD strides of a [T, H, D] tensor."""
    assert t.stride(2) == 1
    return Strides(0, t.stride(0), t.stride(1))


def rel_err(x, ref):
    x, ref = x.float(), ref.float()
    den = ref.norm().item()
    num = (x - ref).norm().item()
    return num / den if den > 0 else num


def lse_dense(q, k, causal, scale):
    """LSE [B, H, S] fp32 of q [B, H, S, D], k [B, Hkv, S, D], chunked over queries."""
    import torch
    b, h, s, d = q.shape
    group = h // k.shape[1]
    out = torch.empty(b, h, s, dtype=torch.float32, device=q.device)
    chunk = max(1, min(s, (1 << 28) // max(1, h * k.shape[2] * 4)))
    kf = k.float().repeat_interleave(group, dim=1) if group > 1 else k.float()
    for bi in range(b):
        for i0 in range(0, s, chunk):
            i1 = min(s, i0 + chunk)
            scores = torch.matmul(q[bi, :, i0:i1].float(), kf[bi].transpose(-1, -2)) * scale
            if causal:
                rows = torch.arange(i0, i1, device=q.device)[:, None]
                cols = torch.arange(k.shape[2], device=q.device)[None, :]
                scores.masked_fill_(cols > rows, float("-inf"))
            out[bi, :, i0:i1] = torch.logsumexp(scores, dim=-1)
            del scores
    return out


def time_cuda(fn, runs, warmup=3):
    """Median milliseconds of fn() over `runs` event-timed calls."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for i in range(runs):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_rounds(fns, runs, timer, rounds):
    """Median over `rounds` of each fn's timer(fn, runs) (ms), the fns
    (a dict name -> fn) taken in turn, round r starting with the r-th."""
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        for i in range(len(names)):
            n = names[(r + i) % len(names)]
            times[n].append(timer(fns[n], runs))
    return {n: statistics.median(t) for n, t in times.items()}


def time_graph(fn, runs, per=10):
    """Median milliseconds of one fn() captured in a CUDA graph, over `runs`
    event-timed batches of `per` back-to-back replays: the GPU's time with
    no host-side dispatch (which bounds PyTorch's backward, and a ctypes
    call, at the sizes of --small)."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for i in range(runs):
        starts[i].record()
        for _ in range(per):
            graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / per


def graph_warmup():
    """Captures one tiny flash backward and drops it: the first autograd
    backward captured in a process fails ("operation failed due to a
    previous error during capture"), the later ones do not."""
    import torch
    from torch.nn.attention import SDPBackend
    q, k, v = (torch.randn(1, 2, 128, 64, dtype=torch.bfloat16, device="cuda").requires_grad_()
               for _ in range(3))
    dout = torch.randn(1, 2, 128, 64, dtype=torch.bfloat16, device="cuda")
    try:
        backward = torch_backend_bshd(SDPBackend.FLASH_ATTENTION, q, k, v, dout, False)[0]
        time_graph(backward, 1, per=1)
    except RuntimeError:
        pass
    torch.cuda.synchronize()


def case_flops(c):
    if c["layout"] == "thd":
        pairs = sum(n * n for n in c["lens"])
    else:
        pairs = c["batch"] * c["seqlen"] ** 2
    # five GEMMs: S = QK^T, dQ = dS K, dK = dS^T Q over head_dim; dP = dO V^T,
    # dV = P^T dO over head_dim_v (4 * 2.5 * D when the two are equal)
    flops = 2.0 * pairs * c["heads_q"] * (3 * c["head_dim"] + 2 * c.get("head_dim_v", c["head_dim"]))
    return flops / 2 if c["causal"] else flops


def torch_backend_bshd(backend, q, k, v, dout, causal):
    """Forward under one backend; returns (backward fn, out, grads, expanded flag)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    group = q.shape[1] // k.shape[1]
    expanded = False
    with sdpa_kernel(backend):
        try:
            if group > 1:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            else:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        except (RuntimeError, TypeError):
            if group == 1:
                raise
            expanded = True
            out = F.scaled_dot_product_attention(q, k.repeat_interleave(group, dim=1),
                                                 v.repeat_interleave(group, dim=1),
                                                 is_causal=causal)

    def backward():
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    return backward, out, backward(), expanded


def ours_bshd(jit, runtime, c, q, k, v, o, dout, lse, causal):
    """Plans, compiles and returns (execute fn, dq, dk, dv)."""
    import torch
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    desc = BwdDesc.init()
    desc.dtype = Dtype.BF16 if q.dtype == torch.bfloat16 else Dtype.FP16
    desc.layout = Layout.BSHD
    desc.batch, desc.heads_q, desc.heads_kv = q.shape[0], q.shape[1], k.shape[1]
    desc.seqlen_q, desc.seqlen_kv = q.shape[2], k.shape[2]
    desc.head_dim, desc.head_dim_v = q.shape[3], v.shape[3]
    desc.q, desc.k, desc.v = bshd_strides(q), bshd_strides(k), bshd_strides(v)
    desc.o, desc.dout = bshd_strides(o), bshd_strides(dout)
    desc.dq, desc.dk, desc.dv = bshd_strides(dq), bshd_strides(dk), bshd_strides(dv)
    desc.lse = LseStrides(lse.stride(0), lse.stride(1), lse.stride(2))
    desc.mask = Mask.CAUSAL_TOP_LEFT if causal else Mask.NONE
    return _ours(jit, runtime, desc, q, k, v, o, dout, lse, dq, dk, dv, None, 0, 0)


def _ours(jit, runtime, desc, q, k, v, o, dout, lse, dq, dk, dv, cu, total_q, total_kv):
    import torch
    plan = jit.plan(runtime, desc)
    ws_bytes = jit.lib.sdpa_bwd_workspace_size(plan)
    workspace = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=q.device)
    t = BwdTensors.init()
    t.q, t.k, t.v, t.o, t.dout = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), dout.data_ptr()
    t.lse = lse.data_ptr()
    t.dq, t.dk, t.dv = dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
    if cu is not None:
        t.cu_seqlens_q = t.cu_seqlens_kv = cu.data_ptr()
        t.total_q, t.total_kv = total_q, total_kv

    def execute():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        jit.check(jit.lib.sdpa_bwd_execute(plan, ctypes.byref(t), ctypes.c_void_p(workspace.data_ptr()),
                                           ws_bytes, stream), "sdpa_bwd_execute")

    execute()
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    jit.check(jit.lib.sdpa_bwd_sync_check(plan, stream), "sdpa_bwd_sync_check")
    execute.keep = (plan, workspace, t)  # alive as long as the closure
    return execute, dq, dk, dv


def run_bshd(jit, runtime, c, runs, memory, timer, rounds):
    import torch
    from torch.nn.attention import SDPBackend
    dtype = torch.bfloat16 if c["dtype"] == "bf16" else torch.float16
    b, h, hkv, s, d = c["batch"], c["heads_q"], c["heads_kv"], c["seqlen"], c["head_dim"]
    dv_ = c.get("head_dim_v", d)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(heads, dim):
        """A [b, heads, s, dim] tensor in the chosen memory order."""
        if memory == "bshd":
            x = torch.randn(b, s, heads, dim, dtype=dtype, device="cuda", generator=gen)
            return x.transpose(1, 2)
        return torch.randn(b, heads, s, dim, dtype=dtype, device="cuda", generator=gen)

    q = randn(h, d).requires_grad_()
    k = randn(hkv, d).requires_grad_()
    v = randn(hkv, dv_).requires_grad_()
    dout = randn(h, dv_)
    row = {"flash": None, "cudnn": None, "ours": None, "check": "", "note": ""}
    ref_grads, o = None, None  # flash's, else cuDNN's
    fns = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            backward, out, grads, expanded = torch_backend_bshd(backend, q, k, v, dout, c["causal"])
            fns[name] = backward
            if expanded:
                row["note"] += f"{name}* "
            if ref_grads is None:
                ref_grads, o = grads, out.detach()
                row["ref"] = name
            del backward, out, grads
        except RuntimeError as e:
            row["note"] += f"{name}: {str(e).splitlines()[0][:60]} "
    if o is None:  # neither: O from the default backend
        import torch.nn.functional as F
        with torch.no_grad():
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(h // hkv, dim=1),
                                               v.repeat_interleave(h // hkv, dim=1),
                                               is_causal=c["causal"])
    with torch.no_grad():
        lse = lse_dense(q.detach(), k.detach(), c["causal"], 1.0 / math.sqrt(d))
        execute, dq, dk, dv = ours_bshd(jit, runtime, c, q.detach(), k.detach(), v.detach(), o,
                                        dout, lse, c["causal"])
        row["family"] = jit.family(execute.keep[0])
        if ref_grads is not None:
            errs = [rel_err(x, r) for x, r in zip((dq, dk, dv), ref_grads)]
            row["errs"] = errs
            row["ok"] = all(e <= c["tol"] for e in errs)
    fns["ours"] = execute
    row.update(time_rounds(fns, runs, timer, rounds))
    return row


def run_thd(jit, runtime, c, runs, timer, rounds):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dtype = torch.bfloat16 if c["dtype"] == "bf16" else torch.float16
    lens, h, d = c["lens"], c["heads_q"], c["head_dim"]
    total = sum(lens)
    cu_list = [0]
    for n in lens:
        cu_list.append(cu_list[-1] + n)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(total, h, d, dtype=dtype, device="cuda", generator=gen).requires_grad_()
    k = torch.randn(total, h, d, dtype=dtype, device="cuda", generator=gen).requires_grad_()
    v = torch.randn(total, h, d, dtype=dtype, device="cuda", generator=gen).requires_grad_()
    dout = torch.randn(total, h, d, dtype=dtype, device="cuda", generator=gen)
    offsets = torch.tensor(cu_list, dtype=torch.int64, device="cuda")
    # cuDNN is not asked: on nested tensors torch has no cuDNN path and runs
    # its math fallback under that backend (5-13 TFLOP/s on an H200).
    row = {"flash": None, "cudnn": None, "ours": None, "check": "",
           "note": "torch on nested jagged tensors; cudnn: no nested path"}
    ref_grads, o = None, None
    fns = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),):
        try:
            nest = [torch.nested.nested_tensor_from_jagged(x, offsets).transpose(1, 2) for x in (q, k, v)]
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(*nest, is_causal=c["causal"])
            out_values = out.transpose(1, 2).values()

            def backward(out_values=out_values):
                return torch.autograd.grad(out_values, (q, k, v), dout, retain_graph=True)

            grads = backward()
            fns[name] = backward
            ref_grads, o = grads, out_values.detach().contiguous()
            row["ref"] = name
            del out, out_values, grads, backward
        except (RuntimeError, NotImplementedError, AttributeError, TypeError) as e:
            row["note"] += f"{name}: n/a ({str(e).splitlines()[0][:50]}) "
    with torch.no_grad():
        if o is None:  # O per sequence from the default backend
            o = torch.empty_like(q)
            for i, n in enumerate(lens):
                sl = slice(cu_list[i], cu_list[i] + n)
                o[sl] = F.scaled_dot_product_attention(
                    q[sl].transpose(0, 1)[None], k[sl].transpose(0, 1)[None],
                    v[sl].transpose(0, 1)[None], is_causal=c["causal"])[0].transpose(0, 1)
        lse = torch.empty(h, total, dtype=torch.float32, device="cuda")  # [h, t]
        for i, n in enumerate(lens):
            sl = slice(cu_list[i], cu_list[i] + n)
            lse[:, sl] = lse_dense(q[sl].detach().transpose(0, 1)[None], k[sl].detach().transpose(0, 1)[None],
                                   c["causal"], 1.0 / math.sqrt(d))[0]
        qd, kd, vd = q.detach(), k.detach(), v.detach()
        dq, dk, dv = torch.empty_like(qd), torch.empty_like(kd), torch.empty_like(vd)
        desc = BwdDesc.init()
        desc.dtype = Dtype.BF16 if dtype == torch.bfloat16 else Dtype.FP16
        desc.layout = Layout.THD
        desc.batch, desc.heads_q, desc.heads_kv = len(lens), h, h
        desc.seqlen_q = desc.seqlen_kv = max(lens)
        desc.head_dim = desc.head_dim_v = d
        desc.q, desc.k, desc.v = thd_strides(qd), thd_strides(kd), thd_strides(vd)
        desc.o, desc.dout = thd_strides(o), thd_strides(dout)
        desc.dq, desc.dk, desc.dv = thd_strides(dq), thd_strides(dk), thd_strides(dv)
        desc.lse = LseStrides(0, lse.stride(0), lse.stride(1))
        desc.max_total_q = desc.max_total_kv = total
        desc.mask = Mask.CAUSAL_TOP_LEFT if c["causal"] else Mask.NONE
        cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
        execute, dq, dk, dv = _ours(jit, runtime, desc, qd, kd, vd, o, dout, lse, dq, dk, dv,
                                    cu, total, total)
        row["family"] = jit.family(execute.keep[0])
        if ref_grads is not None:
            errs = [rel_err(x, r) for x, r in zip((dq, dk, dv), ref_grads)]
            row["errs"] = errs
            row["ok"] = all(e <= c["tol"] for e in errs)
    fns["ours"] = execute
    row.update(time_rounds(fns, runs, timer, rounds))
    return row


def small_grid(args):
    """bench_bwd --small's cases: B 1, H 16; hd 64 at S 1024/1000/512/500,
    hd 128 at S 512/500; causal and not."""
    cases = []
    lengths = {64: (1024, 1000, 512, 500), 128: (512, 500)}
    for dtype in ("bf16", "fp16"):
        if args.dtype and dtype != args.dtype:
            continue
        tol = 1e-2 if dtype == "bf16" else 4e-3
        for hd in (64, 128):
            if args.hd and hd not in args.hd:
                continue
            for causal in (False, True):
                for s in lengths[hd]:
                    if args.seq and s != args.seq:
                        continue
                    cases.append(dict(name=f"{dtype} small S{s} hd{hd} {'causal' if causal else 'full'}",
                                      dtype=dtype, layout="bshd", batch=1, heads_q=16, heads_kv=16,
                                      seqlen=s, head_dim=hd, causal=causal, tol=tol))
    return cases


def grid(args):
    if args.small:
        return small_grid(args)
    cases = []
    thd_lens = [4096, 512, 3000, 1500, 2048, 777, 3333, 1118]  # bench_bwd's, sum 16384
    for dtype in ("bf16", "fp16"):
        if (args.dtype and dtype != args.dtype) or (args.quick and dtype != "bf16"):
            continue
        tol = 1e-2 if dtype == "bf16" else 4e-3
        for hd in (64, 128):
            if (args.hd and hd not in args.hd) or (args.quick and hd != 128):
                continue
            for causal in (False, True):
                for s in (1024, 2048, 4096, 8192, 16384):
                    if (args.quick and s not in (2048, 8192)) or (args.seq and s != args.seq):
                        continue
                    cases.append(dict(name=f"{dtype} bshd S{s // 1024}k hd{hd} {'causal' if causal else 'full'}",
                                      dtype=dtype, layout="bshd", batch=16384 // s, heads_q=2048 // hd,
                                      heads_kv=2048 // hd, seqlen=s, head_dim=hd, causal=causal, tol=tol))
        # head dims beyond 64 and 128 (and 192 / 128, the two head dims of
        # latent-attention models): S 4k and 8k, B*S = 16k, H*D ~ 2k
        for hd, hdv in ((80, 80), (96, 96), (112, 112), (160, 160), (192, 192), (256, 256),
                        (192, 128)):
            if args.quick or (args.hd and hd not in args.hd) or not args.more_head_dims:
                continue
            for causal in (False, True):
                for s in (4096, 8192):
                    if args.seq and s != args.seq:
                        continue
                    dims = f"hd{hd}" if hd == hdv else f"hd{hd}/{hdv}"
                    cases.append(dict(name=f"{dtype} bshd S{s // 1024}k {dims} {'causal' if causal else 'full'}",
                                      dtype=dtype, layout="bshd", batch=16384 // s, heads_q=2048 // hd,
                                      heads_kv=2048 // hd, seqlen=s, head_dim=hd, head_dim_v=hdv,
                                      causal=causal, tol=tol))
        # GQA above head_dim 128 (16 query heads on 2 kv heads, S 8k)
        for hd in (192, 256):
            if (args.quick or not args.more_head_dims or (args.hd and hd not in args.hd)
                    or (args.seq and args.seq != 8192)):
                continue
            for causal in (False, True):
                tag = "causal" if causal else "full"
                cases.append(dict(name=f"{dtype} gqa16/2 S8k hd{hd} {tag}", dtype=dtype, layout="bshd",
                                  batch=2, heads_q=16, heads_kv=2, seqlen=8192, head_dim=hd,
                                  causal=causal, tol=tol))
        if (not args.hd or 128 in args.hd) and not args.seq:
            for causal in (False, True):
                tag = "causal" if causal else "full"
                cases.append(dict(name=f"{dtype} gqa64/8 S4k hd128 {tag}", dtype=dtype, layout="bshd",
                                  batch=4, heads_q=64, heads_kv=8, seqlen=4096, head_dim=128,
                                  causal=causal, tol=tol))
                cases.append(dict(name=f"{dtype} thd mixed hd128 {tag}", dtype=dtype, layout="thd",
                                  lens=thd_lens, heads_q=16, heads_kv=16, head_dim=128,
                                  causal=causal, tol=tol))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default="build/libsdpa_jit.so")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--small", action="store_true",
                    help="instead, bench_bwd --small's problems (B 1, H 16)")
    ap.add_argument("--dtype", choices=["bf16", "fp16"])
    ap.add_argument("--hd", type=lambda v: [int(x) for x in v.split(",")],
                    help="only the cases of these head dims (comma-separated)")
    ap.add_argument("--more-head-dims", action="store_true",
                    help="also head dims 80, 96, 112, 160, 192, 256 and 192/128 (S 4k, 8k), "
                         "and GQA 16/2 at hd 192 and 256 (S 8k)")
    ap.add_argument("--seq", type=int, help="only the BSHD cases of this sequence length")
    ap.add_argument("--memory", choices=["bhsd", "bshd"], default="bhsd",
                    help="memory order of the BSHD cases' tensors")
    ap.add_argument("--graph", action="store_true",
                    help="time each backward captured in a CUDA graph (the default with --small)")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of timing, the backends taken in turn (median of the rounds)")
    ap.add_argument("--csv")
    args = ap.parse_args()
    runs = max(20, args.runs)
    graph = args.graph or args.small
    timer = time_graph if graph else time_cuda

    import torch
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 77
    torch.empty(1, device="cuda")  # the primary context, current on this thread
    if graph:
        graph_warmup()
    jit = SdpaJit(args.lib)
    runtime = jit.runtime()
    cache = jit.lib.sdpa_runtime_cache_path(runtime)
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; "
          f"sdpa-jit {jit.lib.sdpa_version().decode()}; cache {cache.decode() if cache else '(memory)'}; "
          f"BSHD cases in {args.memory} memory order; "
          f"{'CUDA graph replays' if graph else 'event-timed calls'}")

    def tf(c, ms):
        return case_flops(c) / (ms * 1e-3) / 1e12 if ms else None

    def fmt(x, spec):
        return format(x, spec) if x is not None else "n/a"

    header = f"{'case':<30} {'flash':>7} {'cudnn':>7} {'ours':>7} {'/flash':>7} {'/cudnn':>7}  check"
    print("\nTFLOP/s of the backward (median of %d runs)\n%s" % (runs, header))
    csv = open(args.csv, "w") if args.csv else None
    if csv:
        csv.write("case,family,flash_tflops,cudnn_tflops,ours_tflops,ours_over_flash,ours_over_cudnn,"
                  "err_dq,err_dk,err_dv,check,note\n")
    failures = 0
    for c in grid(args):
        try:
            row = (run_thd(jit, runtime, c, runs, timer, max(1, args.rounds)) if c["layout"] == "thd"
                   else run_bshd(jit, runtime, c, runs, args.memory, timer, max(1, args.rounds)))
        except RuntimeError as e:
            failures += 1
            print(f"{c['name']:<30} FAILED: {str(e).splitlines()[0]}")
            continue
        finally:
            torch.cuda.empty_cache()
        f, n, o = tf(c, row["flash"]), tf(c, row["cudnn"]), tf(c, row["ours"])
        rf = o / f if f and o else None
        rn = o / n if n and o else None
        if "errs" in row:
            check = ("ok" if row["ok"] else "MISMATCH") + " (%.1e %.1e %.1e)" % tuple(row["errs"])
            failures += not row["ok"]
        else:
            check = "unchecked (no reference gradients)"
        if "ref" in row and row["ref"] != "flash":
            check += f" vs {row['ref']}"
        print(f"{c['name']:<30} {fmt(f, '7.1f')} {fmt(n, '7.1f')} {fmt(o, '7.1f')} "
              f"{fmt(rf, '7.2f')} {fmt(rn, '7.2f')}  {check} [{row.get('family', '?')}] "
              f"{row['note']}".rstrip())
        sys.stdout.flush()
        if csv:
            errs = row.get("errs", [float("nan")] * 3)
            csv.write(f"{c['name']},{row.get('family', '')},{f or ''},{n or ''},{o or ''},{rf or ''},"
                      f"{rn or ''},{errs[0]},{errs[1]},{errs[2]},{check.split()[0]},{row['note'].strip()}\n")
    if csv:
        csv.close()
    jit.lib.sdpa_runtime_destroy(runtime)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
