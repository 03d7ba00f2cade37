"""accuracy -- the pieces of the backward accuracy test: case generation,
references, error metrics and reports. test_gpu_accuracy.py runs them
against the library on a GPU; test_cpu_accuracy.py checks them on the CPU.

Cases
-----
``generate_cases(count, seed)`` draws a fixed list from one seed: bf16 and
fp16; masks none, causal top-left, causal bottom-right and sliding window
(window_left / window_right, -1 unbounded); GQA groups 1, 2, 4, 8; BSHD and
THD (cu_seqlens with per-sequence lengths, empty and length-1 sequences
among them); odd lengths (1, 7, 97, 573, ...) with seqlen_q != seqlen_kv;
deterministic on and off; head dims: the measured 32, 64, 96, 128,
192, 256 (and 128/64, 192/128, 256/128), and other multiples of 8 from 8
to 256 with head_dim_v <= head_dim. Each value of each of these is spread
evenly over the list (each list shuffled on its own) and the sizes are
drawn per case; cases come in threes that share a kernel, so that
compiling stays a fraction of the run. A case the library refuses at plan
time (a head dim it does not take: under SDPA_JIT_ANY_HEAD_DIM=0 only the
measured six) is reported as skipped-unsupported with its message, and
counted.

Inputs and references
---------------------
q, k, v and dO are standard normal numbers in the case's dtype, drawn from
the case's own seed. The reference (ref32) is attention in fp32 computed
from those same inputs: math attention with the mask (visible() follows
sdpa_jit.h's definitions), gradients by autograd. Its LSE (natural-log
logsumexp of the scaled masked scores, fp32, -inf for a row that sees no
key; [B, H, S] under BSHD, [H, T] under THD) and an O in the dtype are the
forward outputs the backward under test is given: where flash runs, the O
and LSE of flash's own forward, the ones flash's backward reads, so that
both backwards are judged on the same inputs; elsewhere ref32's O rounded
to the dtype and its LSE. They matter: Delta = rowsum(dO * O) takes O's
rounding into every dS of the row, and in a row where it is large it sets
the largest error of dQ; the LSE moves which P round up, which sets dV's
largest error when few rows add into it. Measured on the H200: given
ref32's rounded O, ours reached up to 1.83x flash's max error (flash given
its own), with the same RMS error (median ratio 0.99); given flash's O,
ours and flash's max errors were equal to three digits in all eight of
the cases that had differed most, as was an fp32 emulation of the
kernels' roundings given each O. Ours from ref32's O and LSE is still
recorded where flash ran (ours_ref32_o), not judged.

Two peers are measured against ref32 the same way: PyTorch's low-precision
computation (the same math attention in the dtype, autograd), and
FlashAttention-2 where PyTorch's FLASH_ATTENTION backend can run the case
(F.scaled_dot_product_attention under sdpa_kernel(FLASH_ATTENTION), with
its own forward; it has no mask other than none and is_causal, which means
top-left in PyTorch, needs equal head dims, and may refuse a case: then it
is n/a, with the reason recorded).

Criterion
---------
For each of dQ, dK, dV, with err(x) = max |x - ref32| over the tensor:

    err(ours) <= 1.25 * err(flash) + floor    where flash ran
    err(ours) <= 2    * err(torch) + floor    elsewhere

FlashAttention's own tests hold their kernels to twice PyTorch's
low-precision error; a fused kernel that computes the same way in fp32
(flash) is a tighter peer, hence 1.25.

The floor is the fp32 reference's own resolution, measured per case and
gradient: twice the largest disagreement between two fp32 computations of
that gradient, autograd through the softmax (ref32) and FlashAttention's
backward formulas dS = P * (dP - rowsum(dO * O)) (the ones the kernels
use; formula_gradients(), with Delta summed in fp64 and rounded once):

    floor = max(2 * max |ref32 - ref32_formulas|,
                2^-20 * max over dQ, dK, dV of max |ref32|)

FlashAttention's tests allow twice their reference's rounding in the same
way (hopper/test_flash_attn.py: dq_atol = 2 * (dq_ref + 0.3 - 0.3 -
dq_ref).abs().max()). Ordinarily the floor is about 1e-6 of the gradient's
size and the ratios decide alone. Where a gradient is nothing but fp32
rounding it is that rounding: when every row sees exactly one key (a key
length of 1, a window of width 0) dS = P * (dP - Delta) cancels exactly,
the gradient is 0, and an fp32 computation gets noise (which no kernel can
be held below) while PyTorch's low-precision one may get exactly 0; the
twin's Delta, rounded once from fp64, makes the floor that noise. As its
size depends on the order of the fp32 sums, the floor is at least fp32's
resolution at the scale of the case's gradients, 2^-20 * max over dQ, dK,
dV of max|ref| (about 8 units of fp32's rounding; a kernel's bf16/fp16
error is 2^-8 or 2^-11 of it: no real error hides under it). A
constant floor would be wrong at one end or the other: the dtype's
rounding, u * max|ref| (u = 2^-8 for bf16, 2^-11 for fp16), is the size of
a good kernel's whole error (0.7 to 1.7 u * max|ref| for an emulation of
the kernels' arithmetic at these sizes), so adding it would turn 1.25x into
about 2x; a fixed 1e-5 * max|ref| is below the noise of those cancelling
gradients, whose max|ref| is the noise itself. Gradients that are not all
finite (an element left unwritten: outputs are poisoned with NaN) fail.

Reports
-------
``write_report(results, directory, meta)`` writes accuracy.json (every
case: parameters, status, the three errors per gradient, floor, limit,
ratios) and accuracy.md (per dtype / mask / head-dim bucket: count, median
and max of the ours/flash and ours/torch ratios; the worst cases with their
parameters; every unsupported case with the library's message; every
failure). ``summary_table(results)`` is the short table printed to stdout,
whose first line starts with "accuracy:"; ``failure_message(results)``
lists every failing case and gradient.

Environment: SDPA_JIT_ACCURACY_OUT (the reports' directory),
SDPA_JIT_ACCURACY_CASES (how many cases, default DEFAULT_COUNT),
SDPA_JIT_ACCURACY_SEED (default DEFAULT_SEED).

Case generation, the criterion and the reports need neither PyTorch nor a
GPU; the references need PyTorch (on any device).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import statistics
import warnings

try:
    import torch
except ImportError:  # case generation, judging and reports work without it
    torch = None

DEFAULT_COUNT = 480
DEFAULT_SEED = 20261208

DTYPES = ("bf16", "fp16")
LAYOUTS = ("bshd", "thd")
MASKS = ("none", "causal_tl", "causal_br", "window")
GROUPS = (1, 2, 4, 8)
# (head_dim, head_dim_v): the measured head dims, drawn twice as often, and
# other multiples of 8 from 8 to 256 (head_dim_v <= head_dim), which the
# library plans by default (any_head_dim ON) and refuses at plan time under
# SDPA_JIT_ANY_HEAD_DIM=0.
HEAD_DIMS = ((32, 32), (64, 64), (96, 96), (128, 128), (192, 192), (256, 256),
             (128, 64), (192, 128), (256, 128))
NEW_HEAD_DIMS = ((8, 8), (16, 16), (40, 40), (72, 72), (80, 80), (112, 112), (160, 160),
                 (224, 224), (80, 64), (160, 128))
LENGTHS = (1, 7, 16, 33, 64, 97, 128, 200, 256, 333, 573)  # BSHD seqlen_q, seqlen_kv
THD_LENGTHS = (0, 1, 7, 16, 37, 64, 97, 128, 200, 300, 573)  # one sequence's length
WINDOW_SIDES = (-1, 0, 1, 7, 32, 100)
CASES_PER_CLASS = 3  # cases that share a kernel key (generate_cases)
# Bound on a case's work, B * Hq * sum(Sq * Skv) * (D + Dv): the largest
# BSHD case (573 x 573, 8 query heads, D 256) is 1.3e9, about 10 MB a
# score matrix in fp32.
WORK_LIMIT = 2e9

RATIO_FLASH = 1.25
RATIO_TORCH = 2.0
FLOOR_FACTOR = 2.0
# fp32's resolution at the scale of the case's gradients: a floor for the
# gradients that are nothing but rounding (see the module's docstring).
FP32_RESOLUTION = 2.0 ** -20
GRADS = ("dq", "dk", "dv")
UNIT_ROUNDOFF = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}


# ------------------------------------------------------------------ cases


@dataclasses.dataclass(frozen=True)
class Case:
    """One problem. BSHD: batch, seqlen_q, seqlen_kv. THD: lens_q and
    lens_kv, one length per sequence (the descriptor's batch is their
    count, its seqlen_q / seqlen_kv the longest, its token totals their
    sums). heads_q = heads_kv * group; scale = 1/sqrt(head_dim)."""
    index: int
    seed: int
    dtype: str
    layout: str
    mask: str
    window_left: int
    window_right: int
    heads_kv: int
    group: int
    head_dim: int
    head_dim_v: int
    deterministic: bool
    batch: int = 0
    seqlen_q: int = 0
    seqlen_kv: int = 0
    lens_q: tuple = ()
    lens_kv: tuple = ()

    @property
    def heads_q(self):
        return self.heads_kv * self.group

    @property
    def scale(self):
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def total_q(self):
        return self.batch * self.seqlen_q if self.layout == "bshd" else sum(self.lens_q)

    @property
    def total_kv(self):
        return self.batch * self.seqlen_kv if self.layout == "bshd" else sum(self.lens_kv)

    @property
    def max_q(self):
        return self.seqlen_q if self.layout == "bshd" else max(self.lens_q)

    @property
    def max_kv(self):
        return self.seqlen_kv if self.layout == "bshd" else max(self.lens_kv)

    def sequences(self):
        """(seqlen_q, seqlen_kv) of every sequence (BSHD: batch of them)."""
        if self.layout == "bshd":
            return [(self.seqlen_q, self.seqlen_kv)] * self.batch
        return list(zip(self.lens_q, self.lens_kv))

    def segments(self):
        """THD: (q0, q1, k0, k1) token ranges of every sequence."""
        out, q0, k0 = [], 0, 0
        for lq, lk in zip(self.lens_q, self.lens_kv):
            out.append((q0, q0 + lq, k0, k0 + lk))
            q0, k0 = q0 + lq, k0 + lk
        return out

    def work(self):
        return self.heads_q * sum(lq * lk for lq, lk in self.sequences()) * (self.head_dim + self.head_dim_v)

    @property
    def mask_text(self):
        if self.mask == "window":
            return f"window({self.window_left},{self.window_right})"
        return self.mask

    @property
    def dims_text(self):
        d, dv = self.head_dim, self.head_dim_v
        return f"{d}" if d == dv else f"{d}/{dv}"

    @property
    def name(self):
        if self.layout == "bshd":
            shape = f"B{self.batch} S{self.seqlen_q}x{self.seqlen_kv}"
        else:
            shape = (f"q={','.join(map(str, self.lens_q))} kv={','.join(map(str, self.lens_kv))}")
        return (f"#{self.index:03d} {self.dtype} {self.layout} {shape} H{self.heads_q}/{self.heads_kv} "
                f"D{self.dims_text} {self.mask_text}{' det' if self.deterministic else ''}")

    def as_dict(self):
        d = dataclasses.asdict(self)
        d["lens_q"], d["lens_kv"] = list(self.lens_q), list(self.lens_kv)
        d["heads_q"] = self.heads_q
        d["name"] = self.name
        return d


def _spread(rng, values, count):
    """`count` values, each of `values` about equally often, shuffled."""
    out = list(values) * -(-count // len(values))
    rng.shuffle(out)
    return out[:count]


def generate_cases(count=DEFAULT_COUNT, seed=DEFAULT_SEED):
    """The fixed list of cases for `seed` (see the module's docstring).

    Cases come in classes of CASES_PER_CLASS that share what enters the
    kernel's key (dtype, head dims, mask kind, layout, determinism) and
    differ in what is a launch argument (lengths, batch, heads, GQA group,
    window sizes), so each kernel is compiled once and run on several
    shapes: about a third as many compiles as cases."""
    rng = random.Random(seed)
    classes = -(-count // CASES_PER_CLASS)
    kinds = _spread(rng, [(t, dims) for t in DTYPES for dims in HEAD_DIMS * 2 + NEW_HEAD_DIMS], classes)
    layouts = _spread(rng, LAYOUTS, classes)
    masks = _spread(rng, MASKS, classes)
    determinism = _spread(rng, (False, True), classes)
    groups = _spread(rng, GROUPS, count)
    lengths_q = _spread(rng, LENGTHS, count)
    lengths_kv = _spread(rng, LENGTHS, count)
    cases = []
    for i in range(count):
        c = i // CASES_PER_CLASS
        dtype, (d, dv) = kinds[c]
        common = dict(index=i, seed=rng.getrandbits(32), dtype=dtype, layout=layouts[c], mask=masks[c],
                      window_left=-1, window_right=-1, heads_kv=rng.choice((1, 2)), group=groups[i],
                      head_dim=d, head_dim_v=dv, deterministic=determinism[c])
        if masks[c] == "window":
            common.update(window_left=rng.choice(WINDOW_SIDES), window_right=rng.choice(WINDOW_SIDES))
        if layouts[c] == "bshd":
            sq = lengths_q[i]
            skv = sq if rng.random() < 0.3 else lengths_kv[i]
            case = Case(batch=rng.choice((1, 2, 3)), seqlen_q=sq, seqlen_kv=skv, **common)
        else:
            n = rng.randint(1, 5)
            lens_q = [rng.choice(THD_LENGTHS) for _ in range(n)]
            lens_kv = list(lens_q) if rng.random() < 0.5 else [rng.choice(THD_LENGTHS) for _ in range(n)]
            if not any(lq and lk for lq, lk in zip(lens_q, lens_kv)):
                lens_q[0] = lens_kv[0] = rng.choice([x for x in THD_LENGTHS if x])
            case = Case(lens_q=tuple(lens_q), lens_kv=tuple(lens_kv), **common)
        cases.append(_fit(rng, case))
    return cases


def _fit(rng, case):
    """`case` shrunk (batch, then kv heads, then THD's longest sequence)
    until its work is within WORK_LIMIT."""
    while case.work() > WORK_LIMIT:
        if case.batch > 1:
            case = dataclasses.replace(case, batch=case.batch - 1)
        elif case.heads_kv > 1:
            case = dataclasses.replace(case, heads_kv=1)
        elif case.layout == "thd":
            lens_q, lens_kv = list(case.lens_q), list(case.lens_kv)
            longest = max(range(len(lens_q)), key=lambda j: lens_q[j] * lens_kv[j])
            lens_q[longest] = max(1, lens_q[longest] // 2)
            lens_kv[longest] = max(1, lens_kv[longest] // 2)
            case = dataclasses.replace(case, lens_q=tuple(lens_q), lens_kv=tuple(lens_kv))
        else:
            break
    return case


# ------------------------------------------------------------ descriptors


def tensor_shapes(case):
    """Shapes of the case's tensors, all packed (contiguous): BSHD
    [B, S, H, D], THD [T, H, D]; LSE [B, H, S] or [H, T]."""
    hq, hkv, d, dv = case.heads_q, case.heads_kv, case.head_dim, case.head_dim_v
    if case.layout == "bshd":
        b, sq, skv = case.batch, case.seqlen_q, case.seqlen_kv
        q, k, v, o = (b, sq, hq, d), (b, skv, hkv, d), (b, skv, hkv, dv), (b, sq, hq, dv)
        lse = (b, hq, sq)
    else:
        tq, tkv = case.total_q, case.total_kv
        q, k, v, o = (tq, hq, d), (tkv, hkv, d), (tkv, hkv, dv), (tq, hq, dv)
        lse = (hq, tq)
    return dict(q=q, k=k, v=v, o=o, dout=o, dq=q, dk=k, dv=v, lse=lse)


def contiguous_strides(shape):
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def descriptor_strides(case):
    """The descriptor's element strides of each packed tensor: Strides
    (batch, seq, head) of q, k, v, o, dout, dq, dk, dv; LseStrides (batch,
    head, seq) of lse (sdpa_jit.h)."""
    # The tensors' dims are in the structs' order: [B, S, H, D] / [T, H, D]
    # against (batch, seq, head), [B, H, S] / [H, T] against (batch, head,
    # seq); THD has no batch stride.
    out = {}
    for name, shape in tensor_shapes(case).items():
        st = contiguous_strides(shape)
        out[name] = (st[0], st[1], st[2]) if case.layout == "bshd" else (0, st[0], st[1])
    return out


def make_desc(case, arch=0):
    """The sdpa_jit.BwdDesc of `case` (packed tensors, explicit strides)."""
    import sdpa_jit
    mask = {"none": sdpa_jit.Mask.NONE, "causal_tl": sdpa_jit.Mask.CAUSAL_TOP_LEFT,
            "causal_br": sdpa_jit.Mask.CAUSAL_BOTTOM_RIGHT, "window": sdpa_jit.Mask.SLIDING_WINDOW}[case.mask]
    fields = dict(dtype=sdpa_jit.Dtype.BF16 if case.dtype == "bf16" else sdpa_jit.Dtype.FP16,
                  heads_q=case.heads_q, heads_kv=case.heads_kv, head_dim=case.head_dim,
                  head_dim_v=case.head_dim_v, mask=mask, window_left=case.window_left,
                  window_right=case.window_right, scale=case.scale, deterministic=int(case.deterministic),
                  arch=arch, **descriptor_strides(case))
    if case.layout == "bshd":
        fields.update(layout=sdpa_jit.Layout.BSHD, batch=case.batch, seqlen_q=case.seqlen_q,
                      seqlen_kv=case.seqlen_kv)
    else:
        fields.update(layout=sdpa_jit.Layout.THD, batch=len(case.lens_q), seqlen_q=case.max_q,
                      seqlen_kv=case.max_kv, max_total_q=case.total_q, max_total_kv=case.total_kv)
    return sdpa_jit.BwdDesc.init(**fields)


def refuses_head_dim(message):
    """Whether a plan-time InvalidArgumentError message is the library
    refusing the head dims (so the case is unsupported, not wrong)."""
    return message.startswith(("desc.head_dim ", "desc.head_dim_v "))


# ------------------------------------------------------------- references


def visible(sq, skv, mask, window_left=-1, window_right=-1, device=None):
    """[sq, skv] bool: which keys each query sees (sdpa_jit.h): top-left
    j <= i; bottom-right j <= i + skv - sq; window i + off - left <= j <=
    i + off + right, off = skv - sq, -1 unbounded."""
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(skv, device=device)[None, :]
    off = skv - sq
    ok = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if mask == "causal_tl":
        ok &= j <= i
    elif mask == "causal_br":
        ok &= j <= i + off
    elif mask == "window":
        if window_left >= 0:
            ok &= j >= i + off - window_left
        if window_right >= 0:
            ok &= j <= i + off + window_right
    elif mask != "none":
        raise ValueError(f"unknown mask {mask!r}")
    return ok


@dataclasses.dataclass
class Inputs:
    q: object
    k: object
    v: object
    dout: object
    cu_seqlens_q: object = None  # THD: int32 offsets on the device
    cu_seqlens_kv: object = None


def torch_dtype(name):
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[name]


def make_inputs(case, device):
    """q, k, v, dO: standard normal in the case's dtype from its seed."""
    gen = torch.Generator(device=device)
    gen.manual_seed(case.seed)
    shapes = tensor_shapes(case)
    dtype = torch_dtype(case.dtype)
    x = {n: torch.randn(shapes[n], generator=gen, device=device, dtype=torch.float32).to(dtype)
         for n in ("q", "k", "v", "dout")}
    inputs = Inputs(**x)
    if case.layout == "thd":
        for name, lens in (("cu_seqlens_q", case.lens_q), ("cu_seqlens_kv", case.lens_kv)):
            offsets = [0]
            for n in lens:
                offsets.append(offsets[-1] + n)
            setattr(inputs, name, torch.tensor(offsets, dtype=torch.int32, device=device))
    return inputs


def expand_heads(x, group):
    """[B, Hkv, S, D] -> [B, Hkv * group, S, D], query head h reading kv
    head h // group, by expand: autograd sums the group's gradients with one
    rounding (fp32 accumulation), as FlashAttention's GQA backward does
    (at::sum over the expanded dK, dV)."""
    if group == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, group, s, d).reshape(b, h * group, s, d)


def attend(q, k, v, ok, scale, want_lse=False):
    """Math attention on [B, H, S, D] blocks in their dtype (FlashAttention's
    attention_ref: scores = (q * scale) @ k^T, the mask, softmax, @ v); GQA
    by expand_heads. A row that sees no key gives 0 (its softmax is
    taken over zeros and dropped, so no NaN reaches autograd). Returns
    (out, lse) with lse in fp32 (float64 for float64 blocks; -inf for such
    rows) when asked for."""
    group = q.shape[1] // k.shape[1]
    k, v = expand_heads(k, group), expand_heads(v, group)
    s = torch.matmul(q * scale, k.transpose(-1, -2))
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s.to(torch.promote_types(s.dtype, torch.float32)), dim=-1) if want_lse else None
    empty = ~ok.any(dim=-1, keepdim=True)
    has_empty = bool(empty.any())
    if has_empty:
        s = s.masked_fill(empty, 0.0)
    p = torch.softmax(s, dim=-1)
    if has_empty:
        p = p.masked_fill(empty, 0.0)
    return torch.matmul(p, v), lse


class FlashNotApplicable(Exception):
    """PyTorch's flash backend cannot run this case (the reason)."""


def flash_attend(q, k, v, ok, scale, want_lse=False):
    """FlashAttention-2 as PyTorch runs it: F.scaled_dot_product_attention
    under sdpa_kernel(FLASH_ATTENTION), for masks it has: none, and
    is_causal (top-left in PyTorch: j <= i), recognized from `ok` itself
    (so a bottom-right causal mask with seqlen_q == seqlen_kv is flash's
    is_causal too). GQA by expand_heads, whose backward sums over the group
    as flash's own GQA backward does. want_lse: also its LSE (fp32,
    natural log), from the flash op that call runs, where that op gives
    the same O; else None."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    if q.shape[-1] != v.shape[-1]:
        raise FlashNotApplicable("head_dim_v != head_dim")
    if bool(ok.all()):
        causal = False
    elif torch.equal(ok, torch.ones_like(ok).tril()):
        causal = True
    else:
        raise FlashNotApplicable("mask other than none or top-left causal")
    group = q.shape[1] // k.shape[1]
    k, v = expand_heads(k, group), expand_heads(v, group)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        except RuntimeError as e:
            raise FlashNotApplicable("refused: " + (str(e).strip().splitlines() or ["?"])[0][:200])
        lse = None
        if want_lse:
            # the same kernel's LSE (what its backward reads), from the op
            # F.scaled_dot_product_attention runs; out stays the one above
            flash_op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention", None)
            if flash_op is not None:
                with torch.no_grad():
                    res = flash_op(q.detach(), k.detach(), v.detach(), 0.0, causal, False, scale=scale)
                if torch.equal(res[0], out.detach()):
                    lse = res[1][..., :q.shape[2]].float()
    return out, lse


def _packed_forward(case, q, k, v, fn, want_lse):
    """fn(q, k, v, ok) -> (out, lse) on [B, H, S, D] blocks, applied to the
    case's packed tensors (BSHD: the whole batch; THD: each sequence, its
    outputs concatenated). Returns out in q's layout and the LSE in
    [B, H, S] / [H, T] (None unless want_lse)."""
    if case.layout == "bshd":
        ok = visible(case.seqlen_q, case.seqlen_kv, case.mask, case.window_left, case.window_right, q.device)
        out, lse = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), ok)
        return out.transpose(1, 2), lse
    outs, lses = [], []
    for q0, q1, k0, k1 in case.segments():
        lq, lk = q1 - q0, k1 - k0
        if lq == 0:
            continue
        if lk == 0:
            outs.append(v.new_zeros((lq, case.heads_q, case.head_dim_v)))
            if want_lse:
                lses.append(torch.full((case.heads_q, lq), float("-inf"), device=q.device))
            continue
        ok = visible(lq, lk, case.mask, case.window_left, case.window_right, q.device)
        out, lse = fn(*(x.transpose(0, 1)[None] for x in (q[q0:q1], k[k0:k1], v[k0:k1])), ok)
        outs.append(out[0].transpose(0, 1))
        if want_lse:
            lses.append(None if lse is None else lse[0])
    whole_lse = want_lse and all(x is not None for x in lses)
    return torch.cat(outs, 0), (torch.cat(lses, 1) if whole_lse else None)


def gradients(case, inputs, fn, dtype, want_lse=False):
    """(out, lse, (dq, dk, dv)) of fn on the inputs cast to `dtype`, by
    autograd with dO as the output gradient; tokens no sequence reads get 0."""
    leaves = [x.detach().to(dtype).requires_grad_() for x in (inputs.q, inputs.k, inputs.v)]
    out, lse = _packed_forward(case, *leaves, lambda q, k, v, ok: fn(q, k, v, ok, case.scale, want_lse),
                               want_lse)
    grads = (None, None, None)
    if out.requires_grad:
        grads = torch.autograd.grad(out, leaves, inputs.dout.to(dtype), allow_unused=True)
    grads = tuple(torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads))
    return out.detach(), (lse.detach() if lse is not None else None), grads


def _formula_block(q, k, v, o, dout, lse, ok, scale, rnd, delta64=False):
    group = q.shape[1] // k.shape[1]
    ke, ve = expand_heads(k, group), expand_heads(v, group)
    s = torch.matmul(q, ke.transpose(-1, -2)) * scale
    row = lse[..., None]
    p = torch.where(ok & torch.isfinite(row), torch.exp(s - row), torch.zeros_like(s))
    dv = torch.matmul(rnd(p).transpose(-1, -2), dout)
    dp = torch.matmul(dout, ve.transpose(-1, -2))
    if delta64:  # the same sum rounded once: dP - Delta differs from ref32's by fp32 rounding alone
        delta = (dout.double() * o.double()).sum(dim=-1, keepdim=True).float()
    else:
        delta = (dout * o).sum(dim=-1, keepdim=True)
    ds = rnd(p * (dp - delta))
    dq = torch.matmul(ds, ke) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q) * scale
    b, hkv, skv = k.shape[0], k.shape[1], k.shape[2]
    return (dq, dk.view(b, hkv, group, skv, -1).sum(2), dv.view(b, hkv, group, skv, -1).sum(2))


def formula_gradients(case, inputs, out, lse, round_to=None):
    """dq, dk, dv by FlashAttention's backward formulas, in fp32, from O and
    LSE as given: P = exp(scale * q.k - LSE) on visible keys, dV = P^T dO,
    dP = dO V^T, Delta = rowsum(dO * O), dS = P * (dP - Delta),
    dQ = scale * dS K, dK = scale * dS^T Q, GQA summed over the group in
    fp32. round_to (a torch dtype): P and dS are rounded to it before their
    products and the results at the end, as the kernels do; None: all fp32
    (the second fp32 computation behind the floor), with Delta summed in
    fp64 and rounded once, so that where dS = P * (dP - Delta) cancels (a
    row that sees one key) the twin differs from ref32 by fp32's rounding
    of that cancellation, as any fp32 kernel does."""
    f32 = [x.float() for x in (inputs.q, inputs.k, inputs.v, inputs.dout)]
    q, k, v, dout = f32
    o = out.float()
    lse = lse.float()
    rnd = (lambda x: x.to(round_to).float()) if round_to is not None else (lambda x: x)
    if case.layout == "bshd":
        ok = visible(case.seqlen_q, case.seqlen_kv, case.mask, case.window_left, case.window_right, q.device)
        dq, dk, dv = _formula_block(*(x.transpose(1, 2) for x in (q, k, v, o, dout)), lse, ok, case.scale, rnd,
                                    round_to is None)
        grads = [g.transpose(1, 2).contiguous() for g in (dq, dk, dv)]
    else:
        grads = [torch.zeros_like(x) for x in (q, k, v)]
        for q0, q1, k0, k1 in case.segments():
            if q1 == q0 or k1 == k0:
                continue
            ok = visible(q1 - q0, k1 - k0, case.mask, case.window_left, case.window_right, q.device)
            blocks = [x.transpose(0, 1)[None] for x in (q[q0:q1], k[k0:k1], v[k0:k1], o[q0:q1], dout[q0:q1])]
            dq, dk, dv = _formula_block(*blocks, lse[:, q0:q1][None], ok, case.scale, rnd, round_to is None)
            grads[0][q0:q1] = dq[0].transpose(0, 1)
            grads[1][k0:k1] = dk[0].transpose(0, 1)
            grads[2][k0:k1] = dv[0].transpose(0, 1)
    if round_to is not None:
        grads = [g.to(round_to) for g in grads]
    return tuple(grads)


def max_error(x, ref):
    """max |x - ref| (inf when x has a non-finite element; 0 when empty)."""
    if x.shape != ref.shape:
        raise ValueError(f"shape {tuple(x.shape)} against the reference's {tuple(ref.shape)}")
    if x.numel() == 0:
        return 0.0
    if not bool(torch.isfinite(x).all()):
        return math.inf
    return (x.float() - ref.float()).abs().max().item()


def rms_error(x, ref):
    """sqrt(mean (x - ref)^2) in fp32 (inf when x has a non-finite
    element; 0 when empty): how far off the whole tensor is, beside the
    criterion's max."""
    if x.numel() == 0:
        return 0.0
    if not bool(torch.isfinite(x).all()):
        return math.inf
    return (x.float() - ref.float()).pow(2).mean().sqrt().item()


def max_abs(x):
    return x.float().abs().max().item() if x.numel() else 0.0


# --------------------------------------------------------------- judging


def _ratio(ours, theirs):
    """ours / theirs; None when undefined (no peer, or a peer error of 0:
    the verdict then rests on the floor)."""
    return ours / theirs if theirs else None


def judge(ours, torch_lowp, flash, floor):
    """The criterion on one gradient's errors (flash None: it did not run).
    Returns the verdict with the limit it was held to."""
    if flash is not None:
        against, theirs, ratio = "flash", flash, RATIO_FLASH
    else:
        against, theirs, ratio = "torch", torch_lowp, RATIO_TORCH
    limit = ratio * theirs + floor
    passed = math.isfinite(ours) and ours <= limit
    margin = ours / limit if limit > 0 else (0.0 if ours == 0 else math.inf)
    return dict(ours=ours, torch=torch_lowp, flash=flash, floor=floor, against=against, limit=limit,
                margin=margin, ratio_flash=_ratio(ours, flash), ratio_torch=_ratio(ours, torch_lowp),
                passed=passed)


def run_case(case, ours, device, use_flash=True):
    """Runs one case: inputs, ref32 (and its formula twin for the floor),
    PyTorch's low-precision and flash's gradients (use_flash False: not
    tried), and ours from ``ours(case, inputs, out, lse) -> (dq, dk, dv)``
    given the reference's fp32 LSE and O rounded to the dtype, or, where
    flash ran, flash's own O and LSE (judged; ours from the reference's is
    recorded too). Returns the result dict: case, name, status ("pass" or
    "fail"), flash ("ran" or why not), o_given ("ref32", "flash" or "flash
    with its LSE"), out
    (O's errors), grads (judge()'s verdict per gradient, with max_ref, the
    RMS errors (rms: ours, torch, flash; not judged), and
    where flash's O was given ours_ref32_o and ratio_flash_ref32_o)."""
    dtype = torch_dtype(case.dtype)
    inputs = make_inputs(case, device)
    out32, lse32, ref = gradients(case, inputs, attend, torch.float32, want_lse=True)
    twin = formula_gradients(case, inputs, out32, lse32)
    out_lp, _, lowp = gradients(case, inputs, attend, dtype)
    flash_reason, flash, lse_fl = "not tried", None, None
    if use_flash:
        try:
            out_fl, lse_fl, flash = gradients(case, inputs, flash_attend, dtype, want_lse=True)
            flash_reason = "ran"
        except FlashNotApplicable as e:
            flash_reason = str(e)
    o = out32.to(dtype).contiguous()
    lse = lse32.contiguous()
    result = dict(case=case.as_dict(), name=case.name, status="pass", message="", flash=flash_reason,
                  out=dict(max_ref=max_abs(out32), torch=max_error(out_lp, out32)))
    if flash is not None:
        # A forward far off the reference computed another mask: not a peer.
        err = max_error(out_fl, out32)
        result["out"]["flash"] = err
        if not err <= 4 * result["out"]["torch"] + UNIT_ROUNDOFF[case.dtype] * result["out"]["max_ref"]:
            flash, result["flash"] = None, f"forward off the reference (max error {err:.3g}): another mask"
    mine = ours(case, inputs, o, lse)
    result["o_given"] = "ref32"
    mine_ref_o = None
    if flash is not None and tuple(out_fl.shape) == tuple(o.shape):
        # Against flash, the O and LSE flash's own backward read (its
        # forward's): the two backwards then see the same inputs. Delta =
        # rowsum(dO * O) carries O's rounding into every dS of its row, and
        # the LSE moves which P round up, so another O's rounding moves the
        # largest errors by as much as the kernels differ; ours from ref32's
        # O and LSE is kept beside it, not judged.
        same_lse = lse_fl is not None and tuple(lse_fl.shape) == tuple(lse.shape)
        mine_ref_o, mine = mine, ours(case, inputs, out_fl.contiguous(),
                                      lse_fl.contiguous() if same_lse else lse)
        result["o_given"] = "flash" + (" with its LSE" if same_lse else "")
    result["grads"] = {}
    scale = max(max_abs(r) for r in ref)  # the case's largest gradient
    for i, g in enumerate(GRADS):
        floor = max(FLOOR_FACTOR * max_error(twin[i], ref[i]), FP32_RESOLUTION * scale)
        verdict = judge(max_error(mine[i], ref[i]), max_error(lowp[i], ref[i]),
                        None if flash is None else max_error(flash[i], ref[i]), floor)
        verdict["max_ref"] = max_abs(ref[i])
        verdict["rms"] = dict(ours=rms_error(mine[i], ref[i]), torch=rms_error(lowp[i], ref[i]),
                              flash=None if flash is None else rms_error(flash[i], ref[i]))
        if mine_ref_o is not None:
            verdict["ours_ref32_o"] = max_error(mine_ref_o[i], ref[i])
            verdict["ratio_flash_ref32_o"] = _ratio(verdict["ours_ref32_o"], verdict["flash"])
        result["grads"][g] = verdict
    if not all(v["passed"] for v in result["grads"].values()):
        result["status"] = "fail"
    return result


def unsupported_result(case, message):
    return dict(case=case.as_dict(), name=case.name, status="unsupported", message=message, flash=None,
                grads={})


def error_result(case, message):
    return dict(case=case.as_dict(), name=case.name, status="error", message=message, flash=None, grads={})


# ---------------------------------------------------------------- reports


def _stats(values):
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.median(values), max(values)


def _bucket_fields(result):
    c = result["case"]
    dims = f"{c['head_dim']}" if c["head_dim"] == c["head_dim_v"] else f"{c['head_dim']}/{c['head_dim_v']}"
    return dict(dtype=c["dtype"], mask=c["mask"], dims=dims)


def _bucket_order(bucket):
    return (DTYPES.index(bucket.get("dtype", DTYPES[0])), MASKS.index(bucket.get("mask", MASKS[0])),
            tuple(int(x) for x in bucket.get("dims", "0").split("/")))


def summarize(results, group=("dtype", "mask", "dims")):
    """Buckets of the cases that ran, by the `group` fields (of dtype, mask,
    dims): count, failures, cases against flash, the median and max of the
    ours/flash and ours/torch ratios over every gradient, and the bucket's
    worst case (largest ours / limit)."""
    buckets = {}
    for r in results:
        if r["status"] not in ("pass", "fail"):
            continue
        fields = {g: v for g, v in _bucket_fields(r).items() if g in group}
        b = buckets.setdefault(tuple(fields.values()),
                               dict(fields, cases=0, failed=0, flash_cases=0, ratios_flash=[], ratios_torch=[],
                                    worst=None, worst_margin=-1.0))
        b["cases"] += 1
        b["failed"] += r["status"] == "fail"
        b["flash_cases"] += r["flash"] == "ran"
        for name, m in r["grads"].items():
            b["ratios_flash"].append(m["ratio_flash"])
            b["ratios_torch"].append(m["ratio_torch"])
            if m["margin"] > b["worst_margin"]:
                b["worst_margin"], b["worst"] = m["margin"], f"{r['name']} {name}"
    out = sorted(buckets.values(), key=_bucket_order)
    for b in out:
        b["flash_median"], b["flash_max"] = _stats(b.pop("ratios_flash"))
        b["torch_median"], b["torch_max"] = _stats(b.pop("ratios_torch"))
    return out


def totals(results):
    count = {s: sum(r["status"] == s for r in results) for s in ("pass", "fail", "unsupported", "error")}
    ran = count["pass"] + count["fail"]
    return dict(cases=len(results), ran=ran, passed=count["pass"], failed=count["fail"],
                unsupported=count["unsupported"], errors=count["error"],
                against_flash=sum(r["status"] in ("pass", "fail") and r["flash"] == "ran" for r in results))


def worst(results, n=15):
    """(margin, result, gradient) of the n (case, gradient) pairs closest to
    (or past) their limit."""
    pairs = [(m["margin"], r, g) for r in results for g, m in r.get("grads", {}).items()]
    pairs.sort(key=lambda x: -x[0])
    return pairs[:n]


def _fmt(x, digits=3):
    if x is None:
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def _json_safe(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def criterion_text():
    return (f"per gradient, err = max|x - ref32|: ours <= {RATIO_FLASH} x flash + floor where flash ran, "
            f"ours <= {RATIO_TORCH} x torch_lowp + floor elsewhere; floor = {FLOOR_FACTOR:g} x "
            f"max|ref32 - ref32_formulas| (the fp32 reference's own resolution), at least 2^-20 x the "
            f"case's largest max|ref32| (fp32's)")


def _ref32_o_text(results):
    """One line on ours given ref32's O and LSE where flash ran (not judged)."""
    ratios = [m["ratio_flash_ref32_o"] for r in results for m in r.get("grads", {}).values()
              if m.get("ratio_flash_ref32_o") is not None]
    if not ratios:
        return "given ref32's O and LSE instead of flash's: not measured"
    over = sum(x > RATIO_FLASH for x in ratios)
    return (f"given ref32's O and LSE instead of flash's (not judged): {over} of {len(ratios)} gradients over "
            f"{RATIO_FLASH} x flash, ours/flash median {_fmt(statistics.median(ratios))} max {_fmt(max(ratios))}")


def summary_table(results):
    """The short table for stdout: totals, per dtype and mask, then ours
    given ref32's O and LSE where flash ran."""
    t = totals(results)
    lines = [f"accuracy: {t['cases']} cases: {t['ran']} ran ({t['against_flash']} against flash), "
             f"{t['unsupported']} unsupported, {t['failed']} failed, {t['errors']} errors",
             f"{'dtype':5} {'mask':9} {'ran':>4} {'fail':>4} {'flash':>5}   ours/flash med    max"
             f"   ours/torch med    max"]
    for b in summarize(results, group=("dtype", "mask")):
        lines.append(f"{b['dtype']:5} {b['mask']:9} {b['cases']:4d} {b['failed']:4d} {b['flash_cases']:5d}   "
                     f"{_fmt(b['flash_median']):>14} {_fmt(b['flash_max']):>6}   {_fmt(b['torch_median']):>14} "
                     f"{_fmt(b['torch_max']):>6}")
    lines.append(_ref32_o_text(results))
    return "\n".join(lines)


def _kernel(result):
    """The kernel that ran (family and tiles), when the runner recorded it."""
    if not result.get("family"):
        return ""
    return f"{result['family'].lower()} {','.join(map(str, result.get('tiles', ())))}"


def failure_message(results):
    """Every failing case and gradient (and every error), or "" if none."""
    lines = []
    for r in results:
        kernel = f" [{_kernel(r)}]" if _kernel(r) else ""
        if r["status"] == "error":
            lines.append(f"{r['name']}{kernel}: error: {r['message']}")
        elif r["status"] == "fail":
            for g, m in r["grads"].items():
                if not m["passed"]:
                    rms = m.get("rms") or {}
                    rms_text = (f"; RMS ours / {m['against']} {_fmt(_ratio(rms['ours'], rms.get(m['against'])))}"
                                if rms else "")
                    lines.append(f"{r['name']} {g}: ours {_fmt(m['ours'])} > limit {_fmt(m['limit'])} "
                                 f"(against {m['against']}; flash {_fmt(m['flash'])}, torch_lowp "
                                 f"{_fmt(m['torch'])}, floor {_fmt(m['floor'])}; flash: {r['flash']}"
                                 f"{rms_text}){kernel}")
    if not lines:
        return ""
    t = totals(results)
    head = (f"{t['failed']} of {t['ran']} cases failed the criterion ({criterion_text()}), "
            f"{t['errors']} could not run:")
    return "\n".join([head] + lines)


def write_report(results, directory, meta=None):
    """Writes accuracy.json and accuracy.md into `directory` (made if
    missing); returns their paths."""
    os.makedirs(directory, exist_ok=True)
    meta = dict(meta or {})
    doc = dict(meta=meta, criterion=criterion_text(), totals=totals(results),
               buckets=summarize(results), cases=results)
    json_path = os.path.join(directory, "accuracy.json")
    with open(json_path, "w") as f:
        json.dump(_json_safe(doc), f, indent=1)
    md_path = os.path.join(directory, "accuracy.md")
    with open(md_path, "w") as f:
        f.write(markdown(results, meta))
    return json_path, md_path


def markdown(results, meta=None):
    t = totals(results)
    out = ["# Backward accuracy by FlashAttention's criterion", ""]
    for k, v in (meta or {}).items():
        out.append(f"- {k}: {v}")
    out += [f"- criterion: {criterion_text()}",
            f"- {t['cases']} cases: {t['ran']} ran ({t['against_flash']} against flash), "
            f"{t['unsupported']} unsupported, {t['failed']} failed, {t['errors']} errors",
            f"- {_ref32_o_text(results)}", ""]
    out += ["## Buckets", "",
            "ratios over dq, dk, dv of every case in the bucket; worst: the case closest to its limit", "",
            "| dtype | mask | head dim | cases | failed | vs flash | ours/flash median | max "
            "| ours/torch median | max | worst (ours / limit) |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for b in summarize(results):
        out.append(f"| {b['dtype']} | {b['mask']} | {b['dims']} | {b['cases']} | {b['failed']} | "
                   f"{b['flash_cases']} | {_fmt(b['flash_median'])} | {_fmt(b['flash_max'])} | "
                   f"{_fmt(b['torch_median'])} | {_fmt(b['torch_max'])} | {b['worst']} "
                   f"({_fmt(b['worst_margin'])}) |")
    out += ["", "## Worst cases", "",
            "| case | grad | ours | flash | torch_lowp | floor | limit | ours / limit | against "
            "| RMS ours / peer | kernel |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
    for margin, r, g in worst(results):
        m = r["grads"][g]
        rms = m.get("rms") or {}
        out.append(f"| {r['name']} | {g} | {_fmt(m['ours'])} | {_fmt(m['flash'])} | {_fmt(m['torch'])} | "
                   f"{_fmt(m['floor'])} | {_fmt(m['limit'])} | {_fmt(margin)} | {m['against']} | "
                   f"{_fmt(_ratio(rms.get('ours'), rms.get(m['against'])) if rms else None)} | {_kernel(r)} |")
    failures = failure_message(results)
    out += ["", "## Failures", ""] + ([f"    {line}" for line in failures.splitlines()] if failures else ["none"])
    reasons = {}
    for r in results:
        if r["status"] in ("pass", "fail") and r["flash"] != "ran":
            reasons[r["flash"]] = reasons.get(r["flash"], 0) + 1
    out += ["", "## Where flash did not run", ""]
    out += [f"- {n}: {reason}" for reason, n in sorted(reasons.items(), key=lambda x: -x[1])] or ["- (always ran)"]
    unsupported = {}
    for r in results:
        if r["status"] == "unsupported":
            unsupported.setdefault(r["message"], []).append(r["name"])
    out += ["", "## Skipped: unsupported by the library", ""]
    for message, names in unsupported.items():
        out.append(f"- {len(names)} x `{message}`")
        out += [f"  - {n}" for n in names]
    if not unsupported:
        out.append("none")
    return "\n".join(out) + "\n"
