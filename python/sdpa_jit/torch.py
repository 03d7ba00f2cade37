"""sdpa_jit.torch -- scaled-dot-product attention for PyTorch whose
backward runs sdpa-jit.

    from sdpa_jit.torch import attention, varlen_attention
    out = attention(q, k, v, causal="top_left")           # q, k, v: [B, H, S, D]
    out = varlen_attention(q, k, v, cu_q, cu_k, max_q, max_k, causal="bottom_right")  # [T, H, D]

The forward is PyTorch's own fused kernel that returns the log-sum-exp:
cuDNN's (``aten._scaled_dot_product_cudnn_attention``) where it computes
the case and PyTorch's dispatcher would pick it (as on Hopper), else
FlashAttention-2 (``aten._flash_attention_forward``: every mask, GQA,
varlen), else the memory-efficient kernel
(``aten._scaled_dot_product_efficient_attention``) for the cases flash
cannot express (top-left causal with seqlen_q < seqlen_kv, head_dim_v <
head_dim); ``forward_backend`` (or $SDPA_JIT_TORCH_FORWARD) sets a
preference. The backward is sdpa-jit's ``sdpa_bwd_execute``, which reads
PyTorch's tensors where they lie: every tensor by its strides (a
[B, H, S, D] tensor is a BSHD tensor with its own strides), and the LSE by
its strides too (flash's and cuDNN's [B, H, S], flash varlen's packed
[H, T], the memory-efficient kernel's rows padded to 32), so nothing is
copied. Inputs whose layout the
kernels cannot read (a last dim that is not contiguous, strides that are
not multiples of 8 elements, pointers not 16-byte aligned) are copied to a
contiguous layout first.

Masks (sdpa-jit's semantics; the forward's are checked against them by
the tests): ``causal="top_left"``: key j visible to query i iff j <= i;
``"bottom_right"``: iff j <= i + Skv - Sq; ``window=(left, right)``: iff
i + off - left <= j <= i + off + right with off = Skv - Sq (the
bottom-right diagonal), -1 unbounded; with ``causal`` the right side is
0. GQA (``enable_gqa=True``): query head h reads kv head h // (Hq / Hkv).

Plans are made once per descriptor (shape class, strides, device) and kept
(at most PLAN_CACHE_SIZE, least recently made dropped); the workspace
comes from PyTorch's caching allocator; the backward runs on the current
stream. A plan used in a CUDA context where its kernels are not loaded
(execute answers SDPA_STATUS_NOT_COMPILED) is compiled in that context
and executed again.

The ops are ``torch.library`` custom ops (``sdpa_jit::attention_forward``,
``sdpa_jit::attention_backward``, ``sdpa_jit::varlen_attention_forward``,
``sdpa_jit::varlen_attention_backward``) with fake implementations and a
registered autograd formula, so they trace under ``torch.compile``
(fullgraph) and can be captured in CUDA graphs. Eager calls take an
``autograd.Function`` over the same implementations (less dispatch
overhead); compiled code takes the custom ops.
"""
from __future__ import annotations

import collections
import ctypes
import math
import os
import threading
import time

import torch

from . import _capi
from ._capi import BwdDesc, BwdTensors, Dtype, Layout, LseStrides, Mask, Status, Strides
from .runtime import Plan, default_runtime

__all__ = ["attention", "varlen_attention", "compile_records", "plan_count", "clear_plans",
           "set_plan_options", "forward_backend", "FORWARDS", "PLAN_CACHE_SIZE"]

PLAN_CACHE_SIZE = 1024

_DTYPES = {torch.float16: Dtype.FP16, torch.bfloat16: Dtype.BF16}
_CAUSAL = {None: Mask.NONE, "top_left": Mask.CAUSAL_TOP_LEFT, "bottom_right": Mask.CAUSAL_BOTTOM_RIGHT}
_MASK_NAMES = {Mask.NONE: "none", Mask.CAUSAL_TOP_LEFT: "causal top_left",
               Mask.CAUSAL_BOTTOM_RIGHT: "causal bottom_right", Mask.SLIDING_WINDOW: "window"}
_NONE, _TL, _BR, _WINDOW = (int(Mask.NONE), int(Mask.CAUSAL_TOP_LEFT), int(Mask.CAUSAL_BOTTOM_RIGHT),
                            int(Mask.SLIDING_WINDOW))

# Testing: fill dq, dk, dv and the workspace with NaN before each backward,
# so a result that was not written shows.
_poison_outputs = False

# ------------------------------------------------------------ arguments


def _resolve_mask(fn, causal, window, equal_lengths):
    """(mask, window_left, window_right) from the user's causal/window.
    `equal_lengths`: whether seqlen_q == seqlen_kv (for every sequence)."""
    if causal not in _CAUSAL:
        raise ValueError(f"{fn}: causal={causal!r} is not allowed: use None, 'top_left' (key j visible to "
                         f"query i iff j <= i) or 'bottom_right' (iff j <= i + seqlen_kv - seqlen_q)")
    if window is None:
        return int(_CAUSAL[causal]), -1, -1
    try:
        left, right = window
        left, right = int(left), int(right)
    except (TypeError, ValueError):
        raise TypeError(f"{fn}: window must be a (left, right) pair of ints (-1: unbounded), "
                        f"not {window!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"{fn}: window={window!r} is not allowed: each side must be >= 0, or -1 for "
                         f"unbounded")
    if causal == "top_left" and not equal_lengths:
        raise ValueError(f"{fn}: causal='top_left' cannot be combined with a window when seqlen_q != "
                         f"seqlen_kv: the window is anchored on the bottom-right diagonal (key j visible "
                         f"to query i iff i+off-left <= j <= i+off+right, off = seqlen_kv - seqlen_q); "
                         f"use causal='bottom_right'")
    if causal is not None:
        right = 0
    if left == -1 and right == -1:
        return _NONE, -1, -1
    if left == -1 and right == 0:
        return _BR, -1, -1
    return _WINDOW, left, right


def _check_scale(fn, scale, head_dim):
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    scale = float(scale)
    if not math.isfinite(scale) or scale == 0.0:
        raise ValueError(f"{fn}: scale={scale!r} is not allowed: give a finite nonzero softmax scale, or "
                         f"None for 1/sqrt(head_dim)")
    return scale


def _check_tensors(fn, names, tensors, dims):
    first = tensors[0]
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a torch.Tensor, not {type(t).__name__}")
        if t.dim() != dims:
            layout = "[B, H, S, D]" if dims == 4 else "[T, H, D]"
            raise ValueError(f"{fn}: {name} has shape {tuple(t.shape)}: expected {dims} dims {layout}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{fn}: {name}.dtype is {t.dtype}: supported are torch.float16 and "
                            f"torch.bfloat16 (cast the inputs, e.g. under torch.autocast)")
        if t.device.type != "cuda":
            raise ValueError(f"{fn}: {name} is on {t.device}: sdpa_jit needs CUDA tensors")
        if t.dtype != first.dtype:
            raise TypeError(f"{fn}: {name}.dtype is {t.dtype} but {names[0]}.dtype is {first.dtype}: "
                            f"q, k and v must have one dtype")
        if t.device != first.device:
            raise ValueError(f"{fn}: {name} is on {t.device} but {names[0]} is on {first.device}: "
                             f"q, k and v must be on one device")


def _check_heads(fn, hq, hkv, enable_gqa):
    if hq != hkv:
        if not enable_gqa:
            raise ValueError(f"{fn}: q has {hq} heads and k/v {hkv}: pass enable_gqa=True for grouped-query "
                             f"attention (query head h reads kv head h // (Hq / Hkv))")
        if hkv == 0 or hq % hkv != 0:
            raise ValueError(f"{fn}: q's {hq} heads are not a multiple of k/v's {hkv}: with GQA each kv "
                             f"head serves a whole group of query heads")


# Which head dims the kernels support is the C library's knowledge: a plan
# for a tiny packed problem is made (no compile) and its error passed on.
_supported = {}


def _check_supported(fn, device, dtype, head_dim, head_dim_v, layout):
    if not isinstance(head_dim, int) or not isinstance(head_dim_v, int):
        return  # symbolic sizes: the backward's plan checks them
    key = (dtype, head_dim, head_dim_v, layout)
    hit = _supported.get(key)
    if hit is None:
        try:
            arch = _device_arch(device.index)
        except Exception:  # fake tensors on a machine without a GPU
            return
        desc = BwdDesc.init(dtype=_DTYPES[dtype], layout=layout, batch=1, heads_q=1, heads_kv=1,
                            seqlen_q=128, seqlen_kv=128, head_dim=head_dim, head_dim_v=head_dim_v,
                            arch=arch)
        try:
            Plan(default_runtime(), desc).destroy()
            hit = ""
        except _capi.SdpaError as e:
            hit = e.message
        _supported[key] = hit
    if hit:
        raise ValueError(f"{fn}: head_dim {head_dim} (q, k) / head_dim_v {head_dim_v} (v) in {dtype} is not "
                         f"supported by sdpa-jit's backward: {hit}")


_archs = {}


def _device_arch(index):
    arch = _archs.get(index)
    if arch is None:
        major, minor = torch.cuda.get_device_capability(index)
        arch = _archs[index] = major * 10 + minor
    return arch


# --------------------------------------------------------------- forward
# The fake implementations run the same code on fake tensors, which runs
# PyTorch's meta functions; the real ones give their outputs the layouts
# those say (a real output in another layout is copied into it), so
# compiled code sees the strides it was traced with.


def _is_fake(t):
    return isinstance(t, torch._subclasses.FakeTensor) or t.device.type == "meta"


def _aligned(*tensors):
    """The tensors, each copied when its address is not 16-byte aligned (the
    fused kernels load 16-byte vectors)."""
    return [t.clone() if t.data_ptr() & 15 else t for t in tensors]


FORWARDS = ("auto", "flash", "cudnn", "efficient")
_AUTO, _FLASH, _CUDNN, _EFFICIENT = range(4)


def _forward_preference(fn):
    """The forward kernel preference (``forward_backend``, default from
    $SDPA_JIT_TORCH_FORWARD) as the int the ops take."""
    if forward_backend not in FORWARDS:
        raise ValueError(f"{fn}: sdpa_jit.torch.forward_backend = {forward_backend!r} is not one of "
                         f"{', '.join(FORWARDS)}")
    return FORWARDS.index(forward_backend)


def _dense_forward_kind(sq, skv, d, dv, hq, hkv, mask, wl, wr, prefer=0):
    """How PyTorch's forward computes the mask: ("flash", is_causal, left,
    right) or ("efficient", is_causal), and whether cuDNN's forward computes
    the same (no mask or a square causal one, equal heads and head dims):
    (kind, cudnn_is_causal or None). `prefer` is an index into FORWARDS.
    Raises ValueError for a case no fused kernel expresses exactly."""
    fn = "sdpa_jit.torch.attention"
    square = mask == _NONE or (mask in (_TL, _BR) and sq == skv)
    cudnn = (mask != _NONE) if square and hq == hkv and d == dv and d in (64, 128) else None
    if prefer == _EFFICIENT and hq == hkv and (mask in (_NONE, _TL) or (mask == _BR and sq == skv)):
        return ("efficient", mask != _NONE), None
    if d != dv:
        if mask == _NONE:
            return ("efficient", False), None
        if mask == _TL or (mask == _BR and sq == skv):
            return ("efficient", True), None
        raise ValueError(f"{fn}: head_dim_v {dv} != head_dim {d} is supported with no mask or causal "
                         f"top_left (PyTorch's memory-efficient forward; flash needs equal head dims), "
                         f"not with {_MASK_NAMES[Mask(mask)]} at seqlen_q {sq} != seqlen_kv {skv}")
    if mask == _NONE:
        return ("flash", False, -1, -1), cudnn
    if mask == _BR:
        return ("flash", True, -1, -1), cudnn
    if mask == _TL:
        if sq == skv:
            return ("flash", True, -1, -1), cudnn
        if skv < sq < 2 * skv:  # j <= i is the window (-1, sq - skv) on the bottom-right diagonal
            return ("flash", False, -1, sq - skv), None
        return ("efficient", True), None
    # A window. FlashAttention-2 treats right >= seqlen_kv as unbounded,
    # which is exact only from right >= seqlen_q - 1 on.
    if wr != -1 and wr >= sq - 1:
        wr = -1
    if wr != -1 and wr >= skv:
        raise ValueError(f"{fn}: window right {wr} with seqlen_q {sq} > seqlen_kv {skv} is not expressible "
                         f"in PyTorch's flash forward (it treats right >= seqlen_kv as unbounded)")
    return ("flash", False, wl, wr), None


def _run_forward(kind, q, k, v, scale):
    """PyTorch's fused forward `kind` on [B, H, S, D] tensors: (out, lse)."""
    name = kind[0]
    if name == "flash":
        sq, skv = q.shape[2], k.shape[2]
        out, lse = _flash_forward(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, None, sq, skv,
                                  0.0, kind[1], False, scale=scale, window_size_left=kind[2],
                                  window_size_right=kind[3])[:2]
        return out.transpose(1, 2), lse
    if name == "cudnn":
        out, lse = _cudnn_forward(q, k, v, None, True, 0.0, kind[1], False, scale=scale)[:2]
        return out, lse[..., 0]  # [B, H, S, 1]: flash's [B, H, S] layout
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    return tuple(_efficient_forward(q, k, v, None, True, 0.0, kind[1], scale=scale)[:2])


_flash_forward = torch.ops.aten._flash_attention_forward.default
_cudnn_forward = torch.ops.aten._scaled_dot_product_cudnn_attention.default
_efficient_forward = torch.ops.aten._scaled_dot_product_efficient_attention.default


class _Forward:
    """What the forward of one signature (shapes, strides, dtype, mask,
    preference) runs: the kernel, and the layouts its outputs must have
    (those of the meta kernel the fake implementation runs)."""
    __slots__ = ("kind", "out_layout", "lse_layout")

    def __init__(self, kind, out_layout, lse_layout):
        self.kind, self.out_layout, self.lse_layout = kind, out_layout, lse_layout


_forwards = {}


def _pytorch_picks_cudnn(q, k, v, is_causal, scale):
    """Whether F.scaled_dot_product_attention would run cuDNN on these
    inputs (its own checks and the user's backend settings)."""
    try:
        from torch.nn.attention import SDPBackend
        return torch._fused_sdp_choice(q, k, v, is_causal=is_causal, scale=scale) == \
            int(SDPBackend.CUDNN_ATTENTION)
    except Exception:
        return False


def _forward_key(q, k, v, mask, wl, wr, prefer):
    """What the forward's choice (_forwards) is kept by."""
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, mask, wl, wr, prefer)


def _run_planned(plan, q, k, v, scale):
    """(out, lse) by a _Forward on aligned inputs, in its layouts."""
    out, lse = _run_forward(plan.kind, q, k, v, scale)
    if out.stride() != plan.out_layout[1] or lse.stride() != plan.lse_layout[1]:
        out = _into_layout(out, plan.out_layout)
        lse = _into_layout(lse, plan.lse_layout)
    return out, lse


def _forward_dense(q, k, v, mask, wl, wr, scale, prefer=0):
    """(out [B, H, Sq, Dv], lse) by PyTorch's fused forward: the kernel of
    _dense_forward_kind (what the fake implementation runs on meta tensors),
    or cuDNN's where it computes the same and is preferred (prefer
    "cudnn", or "auto" where PyTorch itself would pick cuDNN), its outputs
    in the same layouts."""
    if not _is_fake(q):
        plan = _forwards.get(_forward_key(q, k, v, mask, wl, wr, prefer))
        if plan is not None and not ((q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15):
            return _run_planned(plan, q, k, v, scale)
    return _forward_dense_slow(q, k, v, mask, wl, wr, scale, prefer)


def _into_layout(t, layout):
    shape, stride = layout
    if tuple(t.shape) == shape and tuple(t.stride()) == stride:
        return t
    return torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device).copy_(t)


def _forward_dense_slow(q, k, v, mask, wl, wr, scale, prefer):
    b, hq, sq, d = q.shape
    hkv, skv, dv = k.shape[1], k.shape[2], v.shape[3]
    _check_supported("sdpa_jit.torch.attention", q.device, q.dtype, d, dv, Layout.BSHD)
    if b == 0 or hq == 0 or sq == 0 or skv == 0:
        return _empty_forward(q, v, sq)
    original = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride())
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    kind, cudnn_causal = _dense_forward_kind(sq, skv, d, dv, hq, hkv, mask, wl, wr, prefer)
    if _is_fake(q):
        return _run_forward(kind, q, k, v, scale)
    q, k, v = _aligned(q, k, v)
    with torch.no_grad():
        metas = _run_forward(kind, *(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
                                     for t in (q, k, v)), scale)
    layouts = [(tuple(m.shape), tuple(m.stride())) for m in metas]
    run = kind
    if cudnn_causal is not None and (prefer == _CUDNN or (prefer == _AUTO and _pytorch_picks_cudnn(
            q, k, v, cudnn_causal, scale))):
        run = ("cudnn", cudnn_causal)
    try:
        out, lse = _run_forward(run, q, k, v, scale)
    except RuntimeError:
        if run is kind:
            raise
        run = kind  # cuDNN refused these inputs: the kernel the meta layouts are of
        out, lse = _run_forward(run, q, k, v, scale)
    out, lse = _into_layout(out, layouts[0]), _into_layout(lse, layouts[1])
    if original == (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride()):
        _forwards[_forward_key(q, k, v, mask, wl, wr, prefer)] = _Forward(run, *layouts)
    return out, lse


def _empty_forward(q, v, sq):
    """Outputs for an empty problem: O = 0 (no key: the softmax is empty),
    LSE = +inf (what flash writes for a row with no visible key)."""
    b, h = q.shape[0], q.shape[1]
    out = torch.zeros(b, sq, h, v.shape[-1], dtype=q.dtype, device=q.device).transpose(1, 2)
    lse = torch.full((b, h, sq), float("inf"), dtype=torch.float32, device=q.device)
    return out, lse


def _forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, mask, wl, wr, scale):
    """(out [Tq, H, Dv], lse [H, Tq]) by PyTorch's flash varlen forward."""
    _check_supported("sdpa_jit.torch.varlen_attention", q.device, q.dtype, q.shape[-1], v.shape[-1],
                     Layout.THD)
    tq, hq = q.shape[0], q.shape[1]
    if tq == 0 or hq == 0 or max_q == 0 or k.shape[0] == 0 or max_k == 0:
        out = torch.zeros(tq, hq, v.shape[-1], dtype=q.dtype, device=q.device)
        return out, torch.full((hq, tq), float("inf"), dtype=torch.float32, device=q.device)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if not _is_fake(q):
        q, k, v = _aligned(q, k, v)
    is_causal = mask in (_TL, _BR)
    left, right = (wl, wr) if mask == _WINDOW else (-1, -1)
    out, lse = torch.ops.aten._flash_attention_forward(
        q, k, v, cu_q, cu_k, max_q, max_k, 0.0, is_causal, False, scale=scale,
        window_size_left=left, window_size_right=right)[:2]
    if lse.dim() != 2:
        raise RuntimeError(f"sdpa_jit.torch.varlen_attention: PyTorch's flash varlen forward returned an LSE "
                           f"of shape {tuple(lse.shape)}; sdpa-jit reads the packed [heads, total_q] LSE")
    return out, lse


# -------------------------------------------------------------- backward


class _Entry:
    """A plan ready to execute: its handle, workspace size, and which of the
    call's tensors (dout, q, k, v, out / dq, dk, dv) must first be made
    contiguous because the kernels cannot read their layout."""
    __slots__ = ("plan", "handle", "workspace_bytes", "fix_in", "fix_out")

    def __init__(self, plan, fix_in, fix_out):
        self.plan = plan
        self.handle = plan.handle if plan is not None else None
        self.workspace_bytes = plan.workspace_size if plan is not None else 0
        self.fix_in = fix_in
        self.fix_out = fix_out


_plans = collections.OrderedDict()
_plans_lock = threading.Lock()
_records = []
_records_lock = threading.Lock()
_execute = None
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(index):
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


_plan_options = None  # a BwdPlanOptions for every plan made, or None
_plan_options_epoch = 0  # part of every plan's cache key


def set_plan_options(**fields):
    """Tuning: the sdpa_bwd_plan_options fields (family, q_tile, kv_tile,
    warps, stages, dq_writer, small_grid, graphs, order_group, head_chunks,
    tail_split, longest_first) every plan made from now on gets; no
    arguments: the runtime's defaults again."""
    global _plan_options, _plan_options_epoch
    options = _capi.BwdPlanOptions.init(**fields) if fields else None
    with _plans_lock:
        _plan_options = options
        _plan_options_epoch += 1
        _fast.clear()


def compile_records():
    """One dict per kernel compile this process asked for: device, key,
    key_hash, source ("MEMORY", "SHIPPED", "DISK", "COMPILED"), seconds,
    reason ("first use" or "not loaded in this context"), and the plan's
    family, family_reason and tiles (q_tile, kv_tile, warps, stages)."""
    with _records_lock:
        return [dict(r) for r in _records]


def plan_count():
    """How many plans are cached."""
    return len(_plans)


def clear_plans():
    """Drops the cached plans (each C plan is destroyed once unused)."""
    with _plans_lock:
        _plans.clear()
        _fast.clear()


def _compile(plan, device_index, reason):
    start = time.perf_counter()
    with torch.cuda.device(device_index):
        source = plan.compile()
    record = {"device": device_index, "key": plan.key, "key_hash": plan.key_hash, "source": source.name,
              "seconds": time.perf_counter() - start, "reason": reason}
    try:
        info = plan.info()
        record.update(family=info["family"].name, family_reason=info["family_reason"],
                      tiles=(info["q_tile"], info["kv_tile"], info["warps"], info["stages"]))
    except (_capi.SdpaError, AttributeError):
        pass
    with _records_lock:
        _records.append(record)
    return source


def _strides(t, dims):
    """Strides(batch, seq, head) of `t` whose (batch, seq, head) dims are
    `dims` (None: none), sizes of 1 given valid values."""
    out = []
    for which, dim in zip(("batch", "seq", "head"), dims):
        if dim is None:
            out.append(0)
        elif t.shape[dim] == 1:
            out.append(0 if which == "batch" else 8)
        else:
            out.append(t.stride(dim))
    return Strides(*out)


def _lse_strides(lse, dims):
    out = []
    for which, dim in zip(("batch", "head", "seq"), dims):
        if dim is None:
            out.append(0)
        elif lse.shape[dim] <= 1:
            out.append(1 if which == "seq" else 0)
        else:
            out.append(lse.stride(dim))
    return LseStrides(*out)


def _lookup(key, make):
    entry = _plans.get(key)
    if entry is None:
        entry = make()
        with _plans_lock:
            entry = _plans.setdefault(key, entry)
            while len(_plans) > PLAN_CACHE_SIZE:
                _plans.popitem(last=False)
    return entry


def _launch(entry, tensors, device_index, device):
    """Executes `entry` on the current stream with a fresh workspace; a
    NOT_COMPILED answer (the kernels are not loaded in this thread's CUDA
    context) compiles the plan in the device's context and runs again."""
    global _execute
    if _execute is None:
        _execute = _capi.library().sdpa_bwd_execute
    nbytes = entry.workspace_bytes
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)
    if _poison_outputs:
        workspace.fill_(255)
    ws = workspace.data_ptr()
    if ws & 255:
        raise RuntimeError(f"sdpa_jit: the caching allocator returned a workspace at {ws:#x}, not 256-byte "
                           f"aligned")
    stream = _current_stream(device_index)
    args = (entry.handle, ctypes.byref(tensors), ws, nbytes, stream)
    status = _execute(*args)
    if status == Status.NOT_COMPILED:
        _compile(entry.plan, device_index, "not loaded in this context")
        with torch.cuda.device(device_index):
            status = _execute(*args)
    if status != 0:
        raise _capi.error_for(_capi.library(), status, "sdpa_bwd_execute")


def _acceptable(t):
    """Whether the kernels read `t` ([B, H, S, D] or [T, H, D]) in place:
    last dim contiguous, the other strides positive multiples of 8
    elements (dims of size 1 do not count)."""
    shape, stride = t.shape, t.stride()
    if shape[-1] > 1 and stride[-1] != 1:
        return False
    return all(n == 1 or (s >= 1 and s % 8 == 0) for n, s in zip(shape[:-1], stride[:-1]))


def _empty_in_order(t):
    """An empty tensor shaped like `t` whose memory follows t's stride order
    (densely), also when t is not dense (a view of a packed qkv tensor):
    the gradient is then copied into t's storage without a transpose."""
    if t.is_contiguous():
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    order = sorted(range(t.dim()), key=lambda i: (t.stride(i), t.shape[i]), reverse=True)
    base = torch.empty([t.shape[i] for i in order], dtype=t.dtype, device=t.device)
    return base.permute([order.index(i) for i in range(t.dim())])


def _backward_dense(dout, q, k, v, out, lse, mask, wl, wr, scale, deterministic):
    """(dq, dk, dv) of attention(q, k, v) given dO, O and the forward's LSE."""
    dq, dk, dv = _empty_in_order(q), _empty_in_order(k), _empty_in_order(v)
    if q.shape[0] == 0 or q.shape[1] == 0 or q.shape[2] == 0 or k.shape[2] == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    _backward_into(False, dout, q, k, v, out, lse, dq, dk, dv, None, None, 0, 0,
                   (mask, wl, wr, scale, deterministic))
    return dq, dk, dv


def _backward_varlen(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, mask, wl, wr, scale,
                     deterministic):
    """(dq, dk, dv) of varlen_attention: [T, H, D] tensors, per-sequence
    bounds from cu_seqlens, max_q/max_k the max_s hints."""
    dq, dk, dv = _empty_in_order(q), _empty_in_order(k), _empty_in_order(v)
    if q.shape[0] == 0 or q.shape[1] == 0 or k.shape[0] == 0 or max_q == 0 or max_k == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    _backward_into(True, dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k,
                   (mask, wl, wr, scale, deterministic))
    return dq, dk, dv


def _plan_key(thd, dout, q, k, v, out, lse, dq, dk, dv, cu_q, max_q, max_k, params):
    """What a plan (_plans) is kept by: everything its descriptor is made of."""
    return (thd, q.device.index, _plan_options_epoch, q.dtype, params, max_q, max_k, q.shape, k.shape, v.shape,
            lse.shape, cu_q.shape if thd else None, q.stride(), k.stride(), v.stride(), out.stride(),
            dout.stride(), lse.stride(), dq.stride(), dk.stride(), dv.stride())


def _backward_into(thd, dout, q, k, v, out, lse, dq, dk, dv, cu_q, cu_k, max_q, max_k, params,
                   copied=False):
    """Runs the backward into dq, dk, dv. The plan is looked up by
    everything its descriptor is made of; tensors of a layout the kernels
    cannot read, or at addresses not 16-byte aligned, are copied first (and
    outputs computed in a contiguous copy and copied back)."""
    device = q.device
    index = device.index
    key = _plan_key(thd, dout, q, k, v, out, lse, dq, dk, dv, cu_q, max_q, max_k, params)
    entry = _plans.get(key)
    if entry is None:
        entry = _lookup(key, lambda: _make_entry(thd, dout, q, k, v, out, lse, dq, dk, dv, cu_q, max_q,
                                                 max_k, params))
    ptrs = (dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
    if entry.plan is None or (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4]) & 15:
        if copied:
            names = [n for n, f in zip(("dout", "q", "k", "v", "out", "dq", "dk", "dv"),
                                       entry.fix_in + entry.fix_out) if f]
            raise ValueError(f"sdpa_jit: {', '.join(names)} cannot be read by the kernels even when "
                             f"contiguous: every stride must be a multiple of 8 elements (head_dim "
                             f"{q.shape[-1]}, head_dim_v {v.shape[-1]})")
        fix_in = entry.fix_in if entry.plan is None else (False,) * 5
        fix_out = entry.fix_out if entry.plan is None else (False,) * 3
        ins = [t.contiguous() if fix else t for t, fix in zip((dout, q, k, v, out), fix_in)]
        ins = [t.clone() if t.data_ptr() & 15 else t for t in ins]  # an aligned copy
        outs = [torch.empty(t.shape, dtype=t.dtype, device=t.device) if fix else t
                for t, fix in zip((dq, dk, dv), fix_out)]
        _backward_into(thd, *ins, lse, *outs, cu_q, cu_k, max_q, max_k, params, copied=True)
        for dst, src in zip((dq, dk, dv), outs):
            if dst is not src:
                dst.copy_(src)
        return
    _run_entry(entry, ptrs, lse, dq, dk, dv, (cu_q, cu_k, q.shape[0], k.shape[0]) if thd else None,
               index, device)


def _run_entry(entry, ptrs, lse, dq, dk, dv, varlen, device_index, device):
    """Runs a compiled plan entry on the (dout, q, k, v, out) pointers `ptrs`
    into dq, dk, dv (poisoned with NaN first under test); varlen: (cu_q,
    cu_k, total_q, total_kv) under THD, else None."""
    if _poison_outputs:
        for t in (dq, dk, dv):
            t.fill_(float("nan"))
    cu_q, cu_k, total_q, total_kv = varlen if varlen else (None, None, 0, 0)
    tensors = BwdTensors(1, ptrs[1], ptrs[2], ptrs[3], ptrs[4], ptrs[0], lse.data_ptr(), dq.data_ptr(),
                         dk.data_ptr(), dv.data_ptr(), cu_q.data_ptr() if varlen else None,
                         cu_k.data_ptr() if varlen else None, total_q, total_kv)
    _launch(entry, tensors, device_index, device)


def _make_entry(thd, dout, q, k, v, out, lse, dq, dk, dv, cu_q, max_q, max_k, params):
    """A plan (compiled in the tensors' device's context) for these
    tensors, or an entry saying which of them must be copied first."""
    fix_in = tuple(not _acceptable(t) for t in (dout, q, k, v, out))
    fix_out = tuple(not _acceptable(t) for t in (dq, dk, dv))
    if any(fix_in) or any(fix_out):
        return _Entry(None, fix_in, fix_out)
    mask, wl, wr, scale, deterministic = params
    index = q.device.index
    if thd:
        dims, lse_dims = (None, 0, 1), (None, 0, 1)  # [T, H, D]: tokens, heads; LSE [H, T]
        extra = dict(layout=Layout.THD, batch=cu_q.shape[0] - 1, seqlen_q=max_q, seqlen_kv=max_k,
                     max_total_q=q.shape[0], max_total_kv=k.shape[0])
    else:
        dims, lse_dims = (0, 2, 1), (0, 1, 2)  # [B, H, S, D]: batch, seq, head; LSE [B, H, S]
        extra = dict(layout=Layout.BSHD, batch=q.shape[0], seqlen_q=q.shape[2], seqlen_kv=k.shape[2])
    hd = -1  # the head-dim axis
    desc = BwdDesc.init(
        dtype=_DTYPES[q.dtype], heads_q=q.shape[dims[2]], heads_kv=k.shape[dims[2]],
        head_dim=q.shape[hd], head_dim_v=v.shape[hd],
        q=_strides(q, dims), k=_strides(k, dims), v=_strides(v, dims), o=_strides(out, dims),
        dout=_strides(dout, dims), dq=_strides(dq, dims), dk=_strides(dk, dims), dv=_strides(dv, dims),
        lse=_lse_strides(lse, lse_dims), mask=mask, window_left=wl, window_right=wr, scale=scale,
        deterministic=1 if deterministic else 0, arch=_device_arch(index), **extra)
    plan = Plan(default_runtime(), desc, _plan_options)
    _compile(plan, index, "first use")
    return _Entry(plan, fix_in, fix_out)


# ------------------------------------------------------- custom ops


@torch.library.custom_op("sdpa_jit::attention_forward", mutates_args=(), device_types="cuda")
def _attention_forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: int, window_left: int,
                          window_right: int, scale: float, deterministic: bool, forward: int = 0
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_dense(q, k, v, mask, window_left, window_right, scale, forward)


@_attention_forward_op.register_fake
def _(q, k, v, mask, window_left, window_right, scale, deterministic, forward=0):
    return _forward_dense(q, k, v, mask, window_left, window_right, scale, forward)


@torch.library.custom_op("sdpa_jit::attention_backward", mutates_args=(), device_types="cuda")
def _attention_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor, mask: int, window_left: int,
                           window_right: int, scale: float, deterministic: bool
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_dense(dout, q, k, v, out, lse, mask, window_left, window_right, scale, deterministic)


@_attention_backward_op.register_fake
def _(dout, q, k, v, out, lse, mask, window_left, window_right, scale, deterministic):
    return _empty_in_order(q), _empty_in_order(k), _empty_in_order(v)


def _dense_setup_context(ctx, inputs, output):
    q, k, v, mask, wl, wr, scale, deterministic, forward = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.params = (mask, wl, wr, scale, deterministic)
    ctx.mark_non_differentiable(lse)


def _dense_backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(dout, q, k, v, out, lse, *ctx.params)
    return dq, dk, dv, None, None, None, None, None, None


_attention_forward_op.register_autograd(_dense_backward, setup_context=_dense_setup_context)


@torch.library.custom_op("sdpa_jit::varlen_attention_forward", mutates_args=(), device_types="cuda")
def _varlen_forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                       cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, mask: int,
                       window_left: int, window_right: int, scale: float, deterministic: bool
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask,
                           window_left, window_right, scale)


@_varlen_forward_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask, window_left, window_right,
      scale, deterministic):
    return _forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask,
                           window_left, window_right, scale)


@torch.library.custom_op("sdpa_jit::varlen_attention_backward", mutates_args=(), device_types="cuda")
def _varlen_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: torch.Tensor,
                        cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, mask: int,
                        window_left: int, window_right: int, scale: float, deterministic: bool
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                            max_seqlen_k, mask, window_left, window_right, scale, deterministic)


@_varlen_backward_op.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask, window_left,
      window_right, scale, deterministic):
    return _empty_in_order(q), _empty_in_order(k), _empty_in_order(v)


def _varlen_setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, mask, wl, wr, scale, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
    ctx.params = (max_q, max_k, mask, wl, wr, scale, deterministic)
    ctx.mark_non_differentiable(lse)


def _varlen_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    max_q, max_k, mask, wl, wr, scale, deterministic = ctx.params
    dq, dk, dv = _varlen_backward_op(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, mask, wl, wr,
                                     scale, deterministic)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None


_varlen_forward_op.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)


# ------------------------------------------------ the eager fast path
# An eager attention() call whose signature (shapes, strides, dtypes,
# devices, arguments, forward preference) was seen before skips the
# argument checks and the forward's lookup, and its backward the plan
# lookup: what the signature's first calls decided is kept in a _Fast (at
# most PLAN_CACHE_SIZE signatures; dropped with the plans, and when the
# plan options change). Anything else (unaligned pointers, another dO
# layout) takes the general path.


class _Fast:
    """A seen attention() signature: its checked arguments (mask, window
    left and right, scale, deterministic, forward preference), and what its
    calls found."""
    __slots__ = ("args", "forward", "backward")

    def __init__(self, args):
        self.args = args
        self.forward = None  # the signature's _Forward, once known
        self.backward = None  # a _FastBackward, once a backward ran


class _FastBackward:
    """A backward of one signature and dO layout: its plan entry and the
    gradients' layouts (those _empty_in_order gives)."""
    __slots__ = ("entry", "dout_stride", "grads", "index")

    def __init__(self, entry, dout_stride, grads, index):
        self.entry, self.dout_stride, self.grads, self.index = entry, dout_stride, grads, index


_fast = {}


def _remember_backward(fast, dout, q, k, v, out, lse, grads, params):
    """After a general backward: the plan entry it ran, for the next."""
    entry = _plans.get(_plan_key(False, dout, q, k, v, out, lse, *grads, None, 0, 0, params))
    if entry is not None and entry.plan is not None:
        fast.backward = _FastBackward(entry, dout.stride(),
                                      tuple((t.shape, t.stride()) for t in grads), q.device.index)


def _fast_backward(fast, dout, q, k, v, out, lse):
    """(dq, dk, dv) by the remembered plan, or None for the general path."""
    b = fast.backward
    if b is None or dout.stride() != b.dout_stride:
        return None
    ptrs = (dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr())
    if (ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4]) & 15:
        return None
    (sq, tq), (sk, tk), (sv, tv) = b.grads
    device = q.device
    dq = torch.empty_strided(sq, tq, dtype=q.dtype, device=device)
    dk = torch.empty_strided(sk, tk, dtype=q.dtype, device=device)
    dv = torch.empty_strided(sv, tv, dtype=q.dtype, device=device)
    _run_entry(b.entry, ptrs, lse, dq, dk, dv, None, b.index, device)
    return dq, dk, dv


# --------------------------------------------- eager autograd functions
# The same implementations under a plain autograd.Function: eager calls
# skip the custom-op dispatch (tens of microseconds a call).


class _DenseFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, wl, wr, scale, deterministic, prefer, fast):
        plan = fast.forward
        if plan is not None and not ((q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15):
            out, lse = _run_planned(plan, q, k, v, scale)
        else:
            out, lse = _forward_dense(q, k, v, mask, wl, wr, scale, prefer)
            fast.forward = _forwards.get(_forward_key(q, k, v, mask, wl, wr, prefer))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.params = (mask, wl, wr, scale, deterministic)
        ctx.fast = fast
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        grads = _fast_backward(ctx.fast, dout, q, k, v, out, lse)
        if grads is None:
            grads = _backward_dense(dout, q, k, v, out, lse, *ctx.params)
            _remember_backward(ctx.fast, dout, q, k, v, out, lse, grads, ctx.params)
        return grads[0], grads[1], grads[2], None, None, None, None, None, None, None


class _VarlenFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, mask, wl, wr, scale, deterministic):
        out, lse = _forward_varlen(q, k, v, cu_q, cu_k, max_q, max_k, mask, wl, wr, scale)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.params = (max_q, max_k, mask, wl, wr, scale, deterministic)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = _backward_varlen(dout, q, k, v, out, lse, cu_q, cu_k, *ctx.params)
        return dq, dk, dv, None, None, None, None, None, None, None, None, None


# When False, eager calls go through the custom ops too (tests use both).
eager_function = True

# Which PyTorch forward kernel to prefer (FORWARDS): "auto" (cuDNN where it
# computes the case and F.scaled_dot_product_attention's own dispatcher
# would pick it for these inputs, as it does on Hopper, else
# FlashAttention-2, else the memory-efficient kernel where flash cannot
# express the case), "flash", "cudnn" (cuDNN wherever it computes the case:
# equal heads, head dims 64 or 128, no mask or a square causal one),
# "efficient". Read by each call; the choice for a signature (shapes,
# strides, mask) is made on its first call.
forward_backend = os.environ.get("SDPA_JIT_TORCH_FORWARD", "auto")


def _use_custom_op():
    return not eager_function or torch.compiler.is_compiling()


# ------------------------------------------------------------- public API


def attention(q, k, v, *, causal=None, window=None, scale=None, enable_gqa=False, deterministic=False):
    """Scaled-dot-product attention of q [B, Hq, Sq, D], k [B, Hkv, Skv, D],
    v [B, Hkv, Skv, Dv] (fp16 or bf16, one CUDA device, any strides), as
    ``torch.nn.functional.scaled_dot_product_attention`` computes it, with
    sdpa-jit's backward. Returns O [B, Hq, Sq, Dv].

    causal: None, "top_left" (key j visible to query i iff j <= i; what
    F.scaled_dot_product_attention's is_causal means) or "bottom_right"
    (iff j <= i + Skv - Sq). window: (left, right) on the bottom-right
    diagonal, -1 unbounded (with causal, right is 0). scale: None for
    1/sqrt(D). enable_gqa: allow Hkv < Hq (query head h reads kv head
    h // (Hq / Hkv)). deterministic: a bitwise reproducible backward.
    """
    sig = None
    if eager_function and not torch.compiler.is_compiling():
        try:
            sig = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype,
                   q.device, k.device, v.device, causal, window, scale, enable_gqa, bool(deterministic),
                   forward_backend)
            fast = _fast.get(sig)
        except (AttributeError, TypeError):  # not tensors, or arguments that do not hash
            sig = fast = None
        if fast is not None:
            out, _ = _DenseFunction.apply(q, k, v, *fast.args, fast)
            return out
    fn = "sdpa_jit.torch.attention"
    _check_tensors(fn, ("q", "k", "v"), (q, k, v), 4)
    b, hq, sq, d = q.shape
    if k.shape[0] != b or v.shape[0] != b:
        raise ValueError(f"{fn}: batch sizes differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[3] != d:
        raise ValueError(f"{fn}: q's head_dim {d} != k's {k.shape[3]}: q and k must have one head_dim")
    if v.shape[1] != k.shape[1] or v.shape[2] != k.shape[2]:
        raise ValueError(f"{fn}: k {tuple(k.shape)} and v {tuple(v.shape)} must agree in heads and "
                         f"sequence length")
    _check_heads(fn, hq, k.shape[1], enable_gqa)
    mask, wl, wr = _resolve_mask(fn, causal, window, sq == k.shape[2])
    scale = _check_scale(fn, scale, d)
    deterministic = bool(deterministic)
    prefer = _forward_preference(fn)
    if _use_custom_op():
        out, _ = _attention_forward_op(q, k, v, mask, wl, wr, scale, deterministic, prefer)
        return out
    fast = _Fast((mask, wl, wr, scale, deterministic, prefer))
    out, _ = _DenseFunction.apply(q, k, v, *fast.args, fast)
    if sig is not None:
        with _plans_lock:
            _fast[sig] = fast
            while len(_fast) > PLAN_CACHE_SIZE:
                del _fast[next(iter(_fast))]
    return out


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=None,
                     window=None, scale=None, enable_gqa=False, deterministic=False):
    """Attention over packed variable-length sequences: q [Tq, Hq, D], k
    [Tk, Hkv, D], v [Tk, Hkv, Dv]; sequence i is rows cu_seqlens_q[i] :
    cu_seqlens_q[i+1] of q (int32 CUDA tensors of batch+1 offsets; empty
    sequences allowed) and likewise of k, v; max_seqlen_q/k bound every
    sequence's length. Masks apply per sequence, as in attention():
    "bottom_right" aligns each sequence's last query with its last key;
    "top_left" needs each query sequence as long as its key sequence (pass
    the same cu_seqlens tensor for both). Returns O [Tq, Hq, Dv]."""
    fn = "sdpa_jit.torch.varlen_attention"
    _check_tensors(fn, ("q", "k", "v"), (q, k, v), 3)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1:
            raise TypeError(f"{fn}: {name} must be a 1-D torch.int32 tensor of batch+1 offsets, not "
                            f"{getattr(cu, 'dtype', type(cu).__name__)} "
                            f"{tuple(cu.shape) if isinstance(cu, torch.Tensor) else ''}")
        if cu.device != q.device:
            raise ValueError(f"{fn}: {name} is on {cu.device} but q is on {q.device}")
        if cu.shape[0] < 2:
            raise ValueError(f"{fn}: {name} has {cu.shape[0]} offsets: it needs batch+1 >= 2")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ValueError(f"{fn}: cu_seqlens_q has {cu_seqlens_q.shape[0]} offsets and cu_seqlens_k "
                         f"{cu_seqlens_k.shape[0]}: one per sequence plus one, for both")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"{fn}: q's head_dim {q.shape[2]} != k's {k.shape[2]}")
    if v.shape[0] != k.shape[0] or v.shape[1] != k.shape[1]:
        raise ValueError(f"{fn}: k {tuple(k.shape)} and v {tuple(v.shape)} must agree in tokens and heads")
    if v.shape[2] != q.shape[2]:
        raise ValueError(f"{fn}: head_dim_v {v.shape[2]} != head_dim {q.shape[2]}: PyTorch's flash varlen "
                         f"forward needs equal head dims")
    _check_heads(fn, q.shape[1], k.shape[1], enable_gqa)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)) or value < 0:
            raise ValueError(f"{fn}: {name} must be an int >= 0 (the longest sequence), not {value!r}")
    same = cu_seqlens_q is cu_seqlens_k
    if causal == "top_left" and not same:
        raise ValueError(f"{fn}: causal='top_left' needs every query sequence as long as its key sequence: "
                         f"pass the same tensor as cu_seqlens_q and cu_seqlens_k, or use "
                         f"causal='bottom_right' (the two agree when the lengths do)")
    mask, wl, wr = _resolve_mask(fn, causal, window, same)
    if mask == _WINDOW and wr != -1 and wr >= max_seqlen_k and not same:
        raise ValueError(f"{fn}: window right {wr} >= max_seqlen_k {max_seqlen_k} with different query and "
                         f"key sequences is not expressible in PyTorch's flash forward (it treats it as "
                         f"unbounded)")
    scale = _check_scale(fn, scale, q.shape[2])
    deterministic = bool(deterministic)
    if _use_custom_op():
        out, _ = _varlen_forward_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask,
                                    wl, wr, scale, deterministic)
    else:
        out, _ = _VarlenFunction.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, mask,
                                       wl, wr, scale, deterministic)
    return out
