"""sdpa_jit.torch against PyTorch on a GPU (skipped without PyTorch or a
CUDA device; the argument checks that need no GPU run wherever PyTorch is).

Numerics follow FlashAttention's criterion: for O, dQ, dK, dV, our max abs
error against a float64 reference is at most twice the max abs error of
PyTorch's own computation in the input dtype
(torch.nn.functional.scaled_dot_product_attention, with the mask as a
boolean attn_mask) against the same reference, plus a floor of one unit
roundoff of the dtype at the tensor's scale (u * max|ref|: both are at
rounding level there). Inputs are fresh random numbers each run (no fixed
seed); dq, dk, dv and the workspace are filled with NaN before every
backward (sdpa_jit.torch._poison_outputs), so an element the kernels do not
write fails the test. The masks are written here from their definitions
(sdpa_jit.h), independently of the package, so the forward PyTorch runs
for us (flash's bottom-right causal and windows, the memory-efficient
kernel's top-left) is checked against them too, and its LSE against the
reference log-sum-exp (natural log; +inf for a row that sees no key).

Set SDPA_JIT_TEST_REPORT=path to get every case's errors as JSON lines.
"""
import json
import math
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch tests need it")
import torch.nn.functional as F  # noqa: E402

import accuracy  # noqa: E402
import sdpa_jit  # noqa: E402
import sdpa_jit.torch as st  # noqa: E402

CAUSAL_MASK = {None: "none", "top_left": "causal_tl", "bottom_right": "causal_br"}

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")
two_gpus = pytest.mark.skipif(not HAS_GPU or torch.cuda.device_count() < 2,
                              reason="needs 2 CUDA devices (this machine has "
                                     f"{torch.cuda.device_count() if HAS_GPU else 0})")
UNIT_ROUNDOFF = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
REPORT = os.environ.get("SDPA_JIT_TEST_REPORT")


@pytest.fixture(autouse=True)
def poisoned():
    st._poison_outputs = True
    yield
    st._poison_outputs = False
    st.forward_backend = "auto"


def report(case, **numbers):
    if REPORT:
        with open(REPORT, "a") as f:
            f.write(json.dumps(dict(case=case, **numbers)) + "\n")


# ------------------------------------------------------------ references


def visible(sq, skv, causal, window, device):
    """Which keys each query sees: the causal mask and the window together
    (accuracy.visible: the definitions in sdpa_jit.h)."""
    ok = accuracy.visible(sq, skv, CAUSAL_MASK[causal], device=device)
    if window is not None:
        ok &= accuracy.visible(sq, skv, "window", window[0], window[1], device=device)
    return ok


def reference(q, k, v, ok, scale):
    """Attention in float64 (q [B, H, S, D]); rows that see no key give 0."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = s.masked_fill(~ok, float("-inf"))
    p = torch.softmax(s, dim=-1).masked_fill(~ok, 0.0)
    return torch.matmul(p, v)


def reference_lse(q, k, ok, scale):
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    s = torch.matmul(q.double(), k.transpose(-1, -2)) * scale
    return torch.logsumexp(s.masked_fill(~ok, float("-inf")), dim=-1)


def naive_attention(q, k, v, ok, scale):
    """Attention by PyTorch's plain ops in the input dtype (FlashAttention's
    attention_ref without upcasting): matmul, masked softmax, matmul."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    p = torch.softmax(s.masked_fill(~ok, float("-inf")), dim=-1).masked_fill(~ok, 0.0)
    return torch.matmul(p.to(v.dtype), v)


def torch_attention(q, k, v, ok, scale):
    """PyTorch's own computation in the input dtype: F.sdpa with the mask
    as a boolean attn_mask; where a row sees no key (F.sdpa's fused kernels
    leave such rows undefined) the naive computation."""
    if not ok.any(dim=-1).all():
        return naive_attention(q, k, v, ok, scale)
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=ok, scale=scale, enable_gqa=gqa)


def grads(fn, q, k, v, dout):
    """(O, dQ, dK, dV) of fn on q, k, v as they lie (detached views: same
    storage, strides and alignment)."""
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out.detach(), dq, dk, dv


def check_against_reference(case, ours, pt, ref, dtype, names=("out", "dq", "dk", "dv")):
    """FlashAttention's criterion on (O, dQ, dK, dV); returns the errors."""
    numbers = {}
    for name, x, p, r in zip(names, ours, pt, ref):
        assert x.shape == r.shape, f"{case} {name}: shape {tuple(x.shape)} vs {tuple(r.shape)}"
        assert torch.isfinite(x).all(), f"{case} {name}: not finite (an element was not written?)"
        err = (x.double() - r).abs().max().item()
        err_pt = (p.double() - r).abs().max().item()
        floor = UNIT_ROUNDOFF[dtype] * r.abs().max().item()
        numbers[name] = (err, err_pt)
        assert err <= 2 * err_pt + floor, \
            f"{case} {name}: max error {err:.3e} > 2 x PyTorch's {err_pt:.3e} + {floor:.3e}"
    report(case, **{f"{n}_ours": e for n, (e, _) in numbers.items()},
           **{f"{n}_torch": e for n, (_, e) in numbers.items()})
    return numbers


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, dtype=dtype, device="cuda")


# --------------------------------------------------------- dense cases
DENSE = [
    # (B, Hq, Hkv, Sq, Skv, D, Dv, causal, window, dtype)
    (2, 4, 4, 256, 256, 64, 64, None, None, torch.bfloat16),
    (2, 4, 4, 256, 256, 64, 64, "top_left", None, torch.bfloat16),
    (2, 4, 4, 256, 256, 64, 64, "bottom_right", None, torch.bfloat16),
    (2, 4, 4, 256, 256, 64, 64, None, (48, 16), torch.bfloat16),
    (2, 4, 4, 256, 256, 64, 64, "bottom_right", (64, -1), torch.bfloat16),
    (2, 4, 4, 200, 333, 64, 64, None, None, torch.bfloat16),
    (2, 4, 4, 200, 333, 64, 64, "top_left", None, torch.bfloat16),       # efficient: Sq < Skv
    (2, 4, 4, 200, 333, 64, 64, "bottom_right", None, torch.bfloat16),
    (2, 4, 4, 200, 333, 64, 64, None, (40, 40), torch.bfloat16),
    (2, 4, 4, 333, 200, 64, 64, "top_left", None, torch.bfloat16),       # flash window (-1, 133)
    (2, 4, 4, 333, 200, 64, 64, "bottom_right", None, torch.bfloat16),   # rows that see no key
    (1, 4, 4, 512, 128, 64, 64, "top_left", None, torch.bfloat16),       # efficient: Sq >= 2 Skv
    (2, 8, 8, 1024, 1024, 128, 128, "top_left", None, torch.bfloat16),   # the table's tiles
    (2, 8, 8, 1024, 1024, 128, 128, None, None, torch.bfloat16),
    (2, 4, 4, 300, 300, 128, 128, None, (100, 0), torch.bfloat16),
    (2, 8, 2, 256, 384, 64, 64, None, None, torch.bfloat16),             # GQA
    (2, 8, 2, 256, 384, 128, 128, "bottom_right", None, torch.bfloat16),
    (2, 6, 1, 256, 256, 64, 64, "top_left", None, torch.bfloat16),       # MQA
    (2, 4, 4, 256, 256, 64, 64, None, None, torch.float16),
    (2, 4, 4, 333, 200, 128, 128, "bottom_right", None, torch.float16),
    (2, 4, 4, 256, 256, 128, 64, None, None, torch.bfloat16),            # head_dim_v < head_dim
    (2, 4, 4, 256, 320, 128, 64, "top_left", None, torch.bfloat16),
]


def dense_id(c):
    b, hq, hkv, sq, skv, d, dv, causal, window, dtype = c
    return (f"{str(dtype)[6:]}-B{b}-H{hq}/{hkv}-S{sq}x{skv}-D{d}/{dv}-{causal or 'nocausal'}"
            f"{'-w%d,%d' % window if window else ''}")


@gpu
@pytest.mark.parametrize("case", DENSE, ids=dense_id)
def test_dense_against_reference(case):
    b, hq, hkv, sq, skv, d, dv, causal, window, dtype = case
    q, k, v = randn(b, hq, sq, d, dtype=dtype), randn(b, hkv, skv, d, dtype=dtype), randn(b, hkv, skv, dv, dtype=dtype)
    dout = randn(b, hq, sq, dv, dtype=dtype)
    scale = 1.0 / math.sqrt(d)
    ok = visible(sq, skv, causal, window, q.device)
    gqa = hq != hkv
    ours = grads(lambda q, k, v: st.attention(q, k, v, causal=causal, window=window, enable_gqa=gqa), q, k, v, dout)
    pt = grads(lambda q, k, v: torch_attention(q, k, v, ok, scale), q, k, v, dout)
    ref = grads(lambda q, k, v: reference(q, k, v, ok, scale), q, k, v, dout.double())
    name = dense_id(case) + ("" if st.forward_backend == "auto" else f"-fwd={st.forward_backend}")
    check_against_reference(name, ours, pt, ref, dtype)


FORWARD_CASES = [(c, "auto") for c in [c for c in DENSE if c[5] == c[6]][:12] + [DENSE[-1]]] + \
    [(c, fwd) for fwd in ("cudnn", "efficient", "flash") for c in (DENSE[0], DENSE[1], DENSE[13], DENSE[12])]


@gpu
@pytest.mark.parametrize("case, forward", FORWARD_CASES, ids=lambda x: x if isinstance(x, str) else dense_id(x))
def test_forward_lse_matches_the_masks(case, forward):
    """The LSE PyTorch's forward returns for us (flash's [B, H, S], the
    memory-efficient kernel's padded rows, cuDNN's [B, H, S, 1]) is the
    natural-log LSE of our mask."""
    b, hq, hkv, sq, skv, d, dv, causal, window, dtype = case
    q, k, v = randn(b, hq, sq, d, dtype=dtype), randn(b, hkv, skv, d, dtype=dtype), randn(b, hkv, skv, dv, dtype=dtype)
    scale = 1.0 / math.sqrt(d)
    mask, wl, wr = st._resolve_mask("test", causal, window, sq == skv)
    out, lse = torch.ops.sdpa_jit.attention_forward(q, k, v, mask, wl, wr, scale, False, st.FORWARDS.index(forward))
    ok = visible(sq, skv, causal, window, q.device)
    ref = reference_lse(q, k, ok, scale)
    lse = lse.reshape(b, hq, -1)[:, :, :sq].double()
    empty = ~ok.any(dim=-1)
    assert torch.all(torch.isposinf(lse[:, :, empty])), "rows that see no key: LSE +inf"
    err = (lse[:, :, ~empty] - ref[:, :, ~empty]).abs().max().item()
    assert err <= 1e-4 * max(1.0, ref[:, :, ~empty].abs().max().item()), f"LSE error {err}"
    out_ref = reference(q, k, v, ok, scale)
    assert (out.double() - out_ref).abs().max().item() <= 4 * UNIT_ROUNDOFF[dtype] * out_ref.abs().max().item() + 1e-3


@gpu
@pytest.mark.parametrize("forward", ["cudnn", "efficient", "flash"])
@pytest.mark.parametrize("case", [DENSE[0], DENSE[1], DENSE[12]], ids=dense_id)
def test_forward_backends_against_reference(case, forward):
    """Gradients with each forward kernel preference (its LSE layout read
    in place by the backward)."""
    st.forward_backend = forward
    test_dense_against_reference(case)


@gpu
def test_auto_forward_follows_pytorchs_choice():
    """"auto" runs cuDNN's forward where F.scaled_dot_product_attention's
    dispatcher would, and flash under sdpa_kernel(FLASH_ATTENTION); either
    way the outputs have the layouts the fake implementation gives."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b, h, s, d = 2, 4, 320, 64
    for backend in (None, SDPBackend.FLASH_ATTENTION):
        st._forwards.clear()
        q, k, v = (randn(b, s, h, d).transpose(1, 2) for _ in range(3))
        if backend is None:
            out, lse = torch.ops.sdpa_jit.attention_forward(q, k, v, 1, -1, -1, d ** -0.5, False, 0)
            picked = torch._fused_sdp_choice(q, k, v, is_causal=True)
            expected = "cudnn" if picked == int(SDPBackend.CUDNN_ATTENTION) else "flash"
        else:
            with sdpa_kernel(backend):
                out, lse = torch.ops.sdpa_jit.attention_forward(q, k, v, 1, -1, -1, d ** -0.5, False, 0)
            expected = "flash"
        (plan,) = st._forwards.values()
        assert plan.kind[0] == expected
        assert out.stride() == (s * h * d, d, h * d, 1) and lse.shape == (b, h, s) and lse.stride() == (h * s, s, 1)
        ok = visible(s, s, "top_left", None, "cuda")
        ref = reference(q, k, v, ok, d ** -0.5)
        assert (out.double() - ref).abs().max().item() <= 4 * UNIT_ROUNDOFF[torch.bfloat16] * ref.abs().max().item()
        report(f"auto-forward-{'default' if backend is None else 'flash'}", kind=plan.kind[0])


# ------------------------------------------------- strides and layouts


def _dense(x):
    """A contiguous copy of x in fresh (aligned) memory."""
    return x.clone(memory_format=torch.contiguous_format)


def _layout_case(name, make, causal="top_left"):
    """make() -> (q, k, v, dout) as the layout under test. PyTorch's error
    is that of its fused kernels in the input dtype on dense copies of the
    same values: on a layout they cannot read (a strided last dim, an
    unaligned pointer) F.sdpa falls back to its math backend, which
    computes in fp32, and its error would be fp32's, not the dtype's."""
    q, k, v, dout = make()
    b, hq, sq, d = q.shape
    scale = 1.0 / math.sqrt(d)
    ok = visible(sq, k.shape[2], causal, None, q.device)
    ours = grads(lambda q_, k_, v_: st.attention(q_, k_, v_, causal=causal), q, k, v, dout)
    pt = grads(lambda q_, k_, v_: torch_attention(_dense(q_), _dense(k_), _dense(v_), ok, scale), q, k, v,
               _dense(dout))
    ref = grads(lambda q_, k_, v_: reference(q_, k_, v_, ok, scale), q, k, v, dout.double())
    check_against_reference(name, ours, pt, ref, q.dtype)


@gpu
def test_views_of_a_packed_qkv_tensor():
    """q, k, v as [B, H, S, D] views of one [B, S, 3, H, D] projection, with
    the gradient flowing back into the packed tensor."""
    b, s, h, d = 2, 320, 4, 64
    qkv = randn(b, s, 3 * h * d).requires_grad_()
    dout = randn(b, h, s, d)

    def run(attn):
        x = qkv.view(b, s, 3, h, d)
        q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
        out = attn(q, k, v)
        return out, torch.autograd.grad(out, qkv, dout)[0]

    scale = 1.0 / math.sqrt(d)
    ok = visible(s, s, "top_left", None, "cuda")
    x = qkv.view(b, s, 3, h, d)
    assert x[:, :, 0].transpose(1, 2).stride() == (s * 3 * h * d, d, 3 * h * d, 1)
    out, g = run(lambda q, k, v: st.attention(q, k, v, causal="top_left"))
    out_pt, g_pt = run(lambda q, k, v: torch_attention(q, k, v, ok, scale))
    qkv64 = qkv.detach().double().requires_grad_()
    x64 = qkv64.view(b, s, 3, h, d)
    out_ref = reference(*(x64[:, :, i].transpose(1, 2) for i in range(3)), ok, scale)
    g_ref = torch.autograd.grad(out_ref, qkv64, dout.double())[0]
    check_against_reference("packed-qkv", (out, g), (out_pt, g_pt), (out_ref, g_ref), torch.bfloat16,
                            names=("out", "dqkv"))


@gpu
def test_bshd_memory_transposed_to_bhsd():
    b, s, h, d = 2, 256, 8, 128
    _layout_case("bshd-transposed", lambda: tuple(randn(b, s, h, d).transpose(1, 2) for _ in range(4)))


@gpu
def test_inputs_the_kernels_cannot_read_are_copied():
    """A non-contiguous last dim, an expanded (stride 0) dO, a pointer that
    is not 16-byte aligned: copied first, results still right."""
    b, s, h, d = 2, 256, 4, 64

    def make():
        q = randn(b, h, d, s).transpose(-1, -2)        # last dim strided
        flat = randn(b * h * s * d + 4)
        k = flat[4:].view(b, h, s, d)                  # 8-byte offset: not 16-byte aligned
        v = randn(b, h, s, d)
        dout = randn(1, h, s, d).expand(b, h, s, d)    # batch stride 0
        return q, k, v, dout

    q, k, v, dout = make()
    assert q.stride(-1) != 1 and k.data_ptr() % 16 != 0 and dout.stride(0) == 0
    _layout_case("copied-inputs", make, causal=None)


@gpu
def test_size_one_dims():
    _layout_case("B1-H1-S1", lambda: (randn(1, 1, 1, 64), randn(1, 1, 77, 64), randn(1, 1, 77, 64),
                                      randn(1, 1, 1, 64)), causal="bottom_right")


@gpu
def test_deterministic_is_bitwise_reproducible():
    b, h, s, d = 2, 8, 512, 64
    q, k, v, dout = (randn(b, h, s, d) for _ in range(4))
    runs = [grads(lambda q, k, v: st.attention(q, k, v, causal="top_left", deterministic=True), q, k, v, dout)
            for _ in range(3)]
    for other in runs[1:]:
        for a, c in zip(runs[0][1:], other[1:]):
            assert torch.equal(a, c)


@gpu
def test_custom_op_and_eager_function_agree():
    b, h, s, d = 2, 4, 256, 64
    q, k, v, dout = (randn(b, h, s, d) for _ in range(4))
    fn = lambda q, k, v: st.attention(q, k, v, causal="bottom_right", deterministic=True)  # noqa: E731
    eager = grads(fn, q, k, v, dout)
    st.eager_function = False
    try:
        through_op = grads(fn, q, k, v, dout)
    finally:
        st.eager_function = True
    for a, c in zip(eager, through_op):
        assert torch.equal(a, c)


@gpu
def test_a_seen_signature_takes_the_fast_path():
    """The second eager call of one signature runs its remembered backward
    (no general backward), with the first call's results bitwise
    (deterministic); a dO of another layout takes the general path again,
    with the same results; outputs poisoned before every backward."""
    b, h, s, d = 2, 4, 320, 64
    q, k, v = (randn(b, h, s, d).requires_grad_() for _ in range(3))
    dout = randn(b, h, s, d)

    def run(do):
        out = st.attention(q, k, v, causal="top_left", deterministic=True)
        return (out.detach(),) + torch.autograd.grad(out, (q, k, v), do)

    st.clear_plans()
    general = st._backward_dense
    calls = []

    def counted(*args):
        calls.append(1)
        return general(*args)

    st._backward_dense = counted
    try:
        first = run(dout)
        assert len(calls) == 1 and len(st._fast) == 1
        (seen,) = st._fast.values()
        assert seen.forward is not None and seen.backward is not None
        second = run(dout)
        assert len(calls) == 1, "the second call took the general backward"
        third = run(dout.transpose(1, 2).contiguous().transpose(1, 2))  # dO in [B, S, H, D] memory
        assert len(calls) == 2, "a new dO layout did not take the general backward"
    finally:
        st._backward_dense = general
    for name, a, c, e in zip(("out", "dq", "dk", "dv"), first, second, third):
        assert torch.isfinite(c).all(), f"{name}: not finite on the fast path"
        assert torch.equal(a, c), f"{name}: the fast path differs from the general one"
        assert torch.equal(a, e), f"{name}: another dO layout differs"
    ok = visible(s, s, "top_left", None, q.device)
    ref = grads(lambda q_, k_, v_: reference(q_, k_, v_, ok, 1.0 / math.sqrt(d)), q, k, v, dout.double())
    pt = grads(lambda q_, k_, v_: torch_attention(q_, k_, v_, ok, 1.0 / math.sqrt(d)), q, k, v, dout)
    check_against_reference("fast-path", second, pt, ref, q.dtype)


@gpu
def test_opcheck():
    """torch.library.opcheck: schema, fake (meta) functions against the real
    ones, autograd registration."""
    b, h, s, d = 1, 2, 128, 64
    q, k, v = (randn(b, h, s, d).requires_grad_() for _ in range(3))
    torch.library.opcheck(torch.ops.sdpa_jit.attention_forward.default, (q, k, v, 1, -1, -1, 0.125, True),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))
    out, lse = torch.ops.sdpa_jit.attention_forward(q, k, v, 1, -1, -1, 0.125, True)
    torch.library.opcheck(torch.ops.sdpa_jit.attention_backward.default,
                          (randn(b, h, s, d), q.detach(), k.detach(), v.detach(), out.detach(), lse, 1, -1, -1,
                           0.125, True), test_utils=("test_schema", "test_faketensor"))


# ------------------------------------------------------------- varlen


def varlen_reference(fn, q, k, v, cu_q, cu_k, causal, window, scale, dtype):
    """Per-sequence dense attention by fn, concatenated ([T, H, D])."""
    outs = []
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for i in range(len(cq) - 1):
        qi = q[cq[i]:cq[i + 1]].transpose(0, 1)[None]
        ki = k[ck[i]:ck[i + 1]].transpose(0, 1)[None]
        vi = v[ck[i]:ck[i + 1]].transpose(0, 1)[None]
        if qi.shape[2] == 0:
            continue
        if ki.shape[2] == 0:
            outs.append(torch.zeros(qi.shape[2], q.shape[1], v.shape[2], dtype=dtype, device=q.device))
            continue
        ok = visible(qi.shape[2], ki.shape[2], causal, window, q.device)
        outs.append(fn(qi, ki, vi, ok, scale)[0].transpose(0, 1))
    return torch.cat(outs, 0)


VARLEN = [
    # (q lens, k lens or None for the same, Hq, Hkv, D, causal, window, dtype)
    ([37, 0, 128, 300, 1, 0, 77], None, 4, 4, 64, None, None, torch.bfloat16),
    ([37, 0, 128, 300, 1, 0, 77], None, 4, 4, 64, "bottom_right", None, torch.bfloat16),
    ([37, 0, 128, 300, 1, 0, 77], None, 4, 4, 64, "top_left", None, torch.bfloat16),
    ([37, 0, 128, 300, 1, 0, 77], None, 4, 4, 128, None, (32, 8), torch.bfloat16),
    ([200, 64, 0, 500], None, 8, 2, 128, "bottom_right", None, torch.bfloat16),
    ([200, 64, 0, 500], None, 4, 4, 64, "bottom_right", None, torch.float16),
    ([50, 100, 7, 0], [80, 30, 0, 64], 4, 4, 64, None, None, torch.bfloat16),   # cross-attention
    ([50, 100, 7, 0], [80, 30, 0, 64], 4, 4, 64, "bottom_right", None, torch.bfloat16),
]


def varlen_id(c):
    lq, lk, hq, hkv, d, causal, window, dtype = c
    return (f"{str(dtype)[6:]}-{'x'.join(map(str, lq))}{'-k' + 'x'.join(map(str, lk)) if lk else ''}-H{hq}/{hkv}"
            f"-D{d}-{causal or 'nocausal'}{'-w%d,%d' % window if window else ''}")


def _cu(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device="cuda")


@gpu
@pytest.mark.parametrize("case", VARLEN, ids=varlen_id)
def test_varlen_against_reference(case):
    lq, lk, hq, hkv, d, causal, window, dtype = case
    cu_q = _cu(lq)
    cu_k = cu_q if lk is None else _cu(lk)
    lk = lq if lk is None else lk
    tq, tk = sum(lq), sum(lk)
    q, k, v = randn(tq, hq, d, dtype=dtype), randn(tk, hkv, d, dtype=dtype), randn(tk, hkv, d, dtype=dtype)
    dout = randn(tq, hq, d, dtype=dtype)
    scale = 1.0 / math.sqrt(d)
    gqa = hq != hkv
    ours = grads(lambda q, k, v: st.varlen_attention(q, k, v, cu_q, cu_k, max(lq), max(lk), causal=causal,
                                                     window=window, enable_gqa=gqa), q, k, v, dout)
    pt = grads(lambda q, k, v: varlen_reference(torch_attention, q, k, v, cu_q, cu_k, causal, window, scale,
                                                dtype), q, k, v, dout)
    ref = grads(lambda q, k, v: varlen_reference(reference, q, k, v, cu_q, cu_k, causal, window, scale,
                                                 torch.float64), q, k, v, dout.double())
    check_against_reference(varlen_id(case), ours, pt, ref, dtype)


@gpu
def test_varlen_strided_views_and_lse_layout():
    """q, k, v as views of one packed [T, 3, H, D] tensor; the LSE flash
    returns is [H, T] and read where it lies."""
    lens = [100, 0, 256, 33]
    h, d = 4, 64
    cu = _cu(lens)
    t = sum(lens)
    qkv = randn(t, 3, h, d)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    out, lse = torch.ops.sdpa_jit.varlen_attention_forward(q, k, v, cu, cu, max(lens), max(lens), 2, -1, -1,
                                                           1 / 8, False)
    assert lse.shape == (h, t) and lse.stride() == (t, 1)
    dout = randn(t, h, d)
    scale = 1 / 8
    ours = grads(lambda q, k, v: st.varlen_attention(q, k, v, cu, cu, max(lens), max(lens), causal="bottom_right"),
                 q, k, v, dout)
    pt = grads(lambda q, k, v: varlen_reference(torch_attention, q, k, v, cu, cu, "bottom_right", None, scale,
                                                torch.bfloat16), q, k, v, dout)
    ref = grads(lambda q, k, v: varlen_reference(reference, q, k, v, cu, cu, "bottom_right", None, scale,
                                                 torch.float64), q, k, v, dout.double())
    check_against_reference("varlen-packed-qkv", ours, pt, ref, torch.bfloat16)


@gpu
def test_varlen_sequence_longer_than_max_seqlen_is_reported():
    lens = [64, 200]
    cu = _cu(lens)
    q, k, v, dout = (randn(sum(lens), 2, 64) for _ in range(4))
    q.requires_grad_()
    out = st.varlen_attention(q, k, v, cu, cu, 128, 128)  # 200 > 128
    out.backward(dout)
    torch.cuda.synchronize()
    with pytest.raises(sdpa_jit.DeviceError, match="longer than desc.seqlen_q"):
        q.grad = None
        st.varlen_attention(q, k, v, cu, cu, 128, 128).backward(dout)


# ----------------------------------------------- compile and graphs


@gpu
@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph(dynamic):
    torch._dynamo.reset()
    b, h, s, d = 2, 4, 256, 64
    w = torch.randn(d, d, device="cuda", dtype=torch.bfloat16) / 8

    def step(x):
        q = x @ w
        out = st.attention(q, x, x, causal="top_left", deterministic=True)
        return (out.float() ** 2).sum()

    compiled = torch.compile(step, fullgraph=True, dynamic=dynamic)
    for seq in ((s, s + 128) if dynamic else (s,)):
        x = randn(b, h, seq, d).requires_grad_()
        loss = compiled(x)
        (g,) = torch.autograd.grad(loss, x)
        x2 = x.detach().clone().requires_grad_()
        loss2 = step(x2)
        (g2,) = torch.autograd.grad(loss2, x2)
        assert torch.isfinite(g).all()
        assert torch.allclose(loss, loss2, rtol=1e-3, atol=1e-3)
        assert (g.float() - g2.float()).abs().max().item() <= 2 * UNIT_ROUNDOFF[torch.bfloat16] * \
            g2.float().abs().max().item()


@gpu
def test_torch_compile_varlen_fullgraph():
    torch._dynamo.reset()
    lens = [64, 0, 190]
    cu = _cu(lens)
    q, k, v = (randn(sum(lens), 4, 64).requires_grad_() for _ in range(3))

    def f(q, k, v):
        return st.varlen_attention(q, k, v, cu, cu, 190, 190, causal="top_left", deterministic=True).float().sum()

    loss = torch.compile(f, fullgraph=True)(q, k, v)
    g = torch.autograd.grad(loss, (q, k, v))
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    g2 = torch.autograd.grad(f(q2, k2, v2), (q2, k2, v2))
    for a, c in zip(g, g2):
        assert torch.equal(a, c)


@gpu
@pytest.mark.parametrize("forward", ["flash", "auto"])
def test_cuda_graph_capture_and_replay(forward):
    """Forward and backward captured in a CUDA graph (our execute launches
    kernel by kernel while the stream is capturing), replayed on new data:
    bitwise equal to eager runs (deterministic mode)."""
    st.forward_backend = forward
    b, h, s, d = 2, 4, 384, 64
    q, k, v = (randn(b, h, s, d).requires_grad_() for _ in range(3))
    dout = randn(b, h, s, d)

    def step():
        out = st.attention(q, k, v, causal="bottom_right", deterministic=True)
        out.backward(dout)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
            q.grad = k.grad = v.grad = None
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    for _ in range(2):
        with torch.no_grad():
            for x in (q, k, v, dout):
                x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        captured = (static_out.clone(), q.grad.clone(), k.grad.clone(), v.grad.clone())
        eager = grads(lambda q, k, v: st.attention(q, k, v, causal="bottom_right", deterministic=True),
                      q.detach(), k.detach(), v.detach(), dout)
        for a, c in zip(captured, eager):
            assert torch.equal(a, c)


# ------------------------------------------------- plans and devices


@gpu
def test_plans_are_cached_per_shape_and_compiled_once():
    st.clear_plans()
    before = len(st.compile_records())
    q, k, v, dout = (randn(2, 4, 256, 64) for _ in range(4))
    for _ in range(3):
        grads(lambda q, k, v: st.attention(q, k, v, causal="top_left"), q, k, v, dout)
    assert st.plan_count() == 1
    records = st.compile_records()[before:]
    assert len(records) == 1 and records[0]["reason"] == "first use"
    assert records[0]["source"] in ("MEMORY", "DISK", "SHIPPED", "COMPILED")
    q2, k2, v2, dout2 = (randn(3, 4, 256, 64) for _ in range(4))  # another batch: another plan, same key
    grads(lambda q, k, v: st.attention(q, k, v, causal="top_left"), q2, k2, v2, dout2)
    assert st.plan_count() == 2
    assert st.compile_records()[-1]["key"] == records[0]["key"]
    assert st.compile_records()[-1]["source"] == "MEMORY"


@gpu
def test_not_compiled_in_this_context_is_compiled_and_run():
    """A plan whose kernels are not loaded in the current context (execute
    answers SDPA_STATUS_NOT_COMPILED) is compiled there and executed."""
    st.clear_plans()
    q, k, v, dout = (randn(2, 4, 256, 64) for _ in range(4))
    fn = lambda q, k, v: st.attention(q, k, v, deterministic=True)  # noqa: E731
    first = grads(fn, q, k, v, dout)
    (key, entry), = st._plans.items()
    raw = sdpa_jit.Plan(sdpa_jit.default_runtime(), entry.plan.desc)  # made, never compiled
    st._plans[key] = st._Entry(raw, entry.fix_in, entry.fix_out)
    st._fast.clear()  # the eager fast path remembers the compiled entry: look the plan up again
    again = grads(fn, q, k, v, dout)
    assert st.compile_records()[-1]["reason"] == "not loaded in this context"
    for a, c in zip(first, again):
        assert torch.equal(a, c)


@two_gpus
def test_plan_compiled_on_one_device_runs_on_the_other():
    """One process, two GPUs: a plan compiled in device 0's context answers
    NOT_COMPILED in device 1's until compiled there; the results on both
    devices are bitwise equal; sdpa_jit.torch keeps a plan per device."""
    b, h, s, d = 2, 4, 256, 64
    inputs0 = [randn(b, h, s, d) for _ in range(4)]  # q, k, v, dout on cuda:0
    q0, k0, v0, do0 = inputs0
    out0, lse0 = torch.ops.sdpa_jit.attention_forward(q0, k0, v0, 1, -1, -1, 0.125, True)
    with torch.cuda.device(1):
        q1, k1, v1, do1, out1, lse1 = (x.to("cuda:1") for x in (q0, k0, v0, do0, out0, lse0))
    rt = sdpa_jit.default_runtime()
    desc = sdpa_jit.BwdDesc.init(dtype=sdpa_jit.Dtype.BF16, layout=sdpa_jit.Layout.BSHD, batch=b, heads_q=h,
                                 heads_kv=h, seqlen_q=s, seqlen_kv=s, head_dim=d, mask=sdpa_jit.Mask.CAUSAL_TOP_LEFT,
                                 scale=0.125, deterministic=1, arch=st._device_arch(0),
                                 q=(h * s * d, d, s * d), k=(h * s * d, d, s * d), v=(h * s * d, d, s * d),
                                 o=(h * s * d, d, s * d), dout=(h * s * d, d, s * d), dq=(h * s * d, d, s * d),
                                 dk=(h * s * d, d, s * d), dv=(h * s * d, d, s * d), lse=(h * s, s, 1))
    plan = rt.plan(desc)

    def run(device, q, k, v, o, do, lse):
        dq, dk, dv = (torch.full_like(x, float("nan")) for x in (q, k, v))
        ws = torch.empty(plan.workspace_size, dtype=torch.uint8, device=device)
        t = sdpa_jit.BwdTensors.init(q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), o=o.data_ptr(),
                                     dout=do.data_ptr(), lse=lse.data_ptr(), dq=dq.data_ptr(), dk=dk.data_ptr(),
                                     dv=dv.data_ptr())
        plan.execute(t, ws.data_ptr(), plan.workspace_size, torch.cuda.current_stream(device).cuda_stream)
        torch.cuda.synchronize(device)
        return dq, dk, dv

    with torch.cuda.device(0):
        plan.compile()
        r0 = run(0, q0, k0, v0, out0, do0, lse0)
    with torch.cuda.device(1):
        with pytest.raises(sdpa_jit.NotCompiledError, match="not loaded in the current CUDA context"):
            run(1, q1, k1, v1, out1, do1, lse1)
        assert plan.compile() in (sdpa_jit.Source.MEMORY, sdpa_jit.Source.DISK)
        r1 = run(1, q1, k1, v1, out1, do1, lse1)
    for a, c in zip(r0, r1):
        assert torch.isfinite(a).all() and torch.equal(a.cpu(), c.cpu())
    # the torch op: one plan per device, bitwise equal results
    st.clear_plans()
    fn = lambda q, k, v: st.attention(q, k, v, causal="top_left", deterministic=True)  # noqa: E731
    g0 = grads(fn, q0, k0, v0, do0)
    with torch.cuda.device(1):
        g1 = grads(fn, q1, k1, v1, do1)
    g1_on_0 = grads(fn, q1, k1, v1, do1)  # current device 0, tensors on 1
    assert st.plan_count() == 2
    assert sorted({r["device"] for r in st.compile_records()[-2:]}) == [0, 1]
    for a, c, e in zip(g0, g1, g1_on_0):
        assert torch.equal(a.cpu(), c.cpu()) and torch.equal(c, e)


# ------------------------------------------------------ argument errors
# These need PyTorch; the ones with CUDA tensors need a GPU.


def test_fp32_inputs_are_refused():
    x = torch.randn(1, 2, 16, 64)
    with pytest.raises(TypeError, match=r"q.dtype is torch.float32: supported are torch.float16 and torch.bfloat16"):
        st.attention(x, x, x)


def test_cpu_tensors_are_refused():
    x = torch.randn(1, 2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="q is on cpu: sdpa_jit needs CUDA tensors"):
        st.attention(x, x, x)


def test_wrong_rank_is_refused():
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"expected 4 dims \[B, H, S, D\]"):
        st.attention(x, x, x)
    with pytest.raises(ValueError, match=r"expected 3 dims \[T, H, D\]"):
        st.varlen_attention(x[None], x[None], x[None], None, None, 16, 16)


@pytest.mark.parametrize("kwargs, error, text", [
    (dict(causal="upper"), ValueError, "causal='upper' is not allowed"),
    (dict(causal=True), ValueError, "causal=True is not allowed"),
    (dict(window=5), TypeError, r"window must be a \(left, right\) pair"),
    (dict(window=(-3, 0)), ValueError, "each side must be >= 0, or -1"),
    (dict(scale=0.0), ValueError, "scale=0.0 is not allowed"),
    (dict(scale=float("nan")), ValueError, "finite nonzero"),
])
@gpu
def test_bad_arguments_name_themselves(kwargs, error, text):
    x = randn(1, 2, 16, 64)
    with pytest.raises(error, match=text):
        st.attention(x, x, x, **kwargs)


@gpu
def test_shape_errors():
    q = randn(1, 4, 16, 64)
    with pytest.raises(ValueError, match="pass enable_gqa=True"):
        st.attention(q, randn(1, 2, 16, 64), randn(1, 2, 16, 64))
    with pytest.raises(ValueError, match="not a multiple of k/v's 3"):
        st.attention(q, randn(1, 3, 16, 64), randn(1, 3, 16, 64), enable_gqa=True)
    with pytest.raises(ValueError, match="head_dim 64 != k's 32"):
        st.attention(q, randn(1, 4, 16, 32), randn(1, 4, 16, 32))
    with pytest.raises(ValueError, match="batch sizes differ"):
        st.attention(q, randn(2, 4, 16, 64), randn(2, 4, 16, 64))
    with pytest.raises(TypeError, match="one dtype"):
        st.attention(q, randn(1, 4, 16, 64, dtype=torch.float16), randn(1, 4, 16, 64))
    with pytest.raises(ValueError, match="cannot be combined with a window when seqlen_q != seqlen_kv"):
        st.attention(q, randn(1, 4, 32, 64), randn(1, 4, 32, 64), causal="top_left", window=(8, 0))
    with pytest.raises(ValueError, match="k is on cpu: sdpa_jit needs CUDA tensors"):
        st.attention(q, q.cpu(), q)


@gpu
def test_unsupported_head_dim_names_what_is_supported():
    for d in (84, 264):  # not a multiple of 8, above 256: unsupported whatever SDPA_JIT_ANY_HEAD_DIM says
        x = randn(1, 2, 16, d)
        with pytest.raises(ValueError, match=f"head_dim {d} .* is not supported by sdpa-jit's backward: "
                                             f"desc.head_dim = {d} is not supported: supported are multiples of 8 "
                                             f"from 8 to 256"):
            st.attention(x, x, x)


@gpu
def test_varlen_argument_errors():
    q = randn(10, 2, 64)
    cu = _cu([4, 6])
    with pytest.raises(TypeError, match="cu_seqlens_q must be a 1-D torch.int32 tensor"):
        st.varlen_attention(q, q, q, cu.long(), cu, 6, 6)
    with pytest.raises(ValueError, match="cu_seqlens_q has 3 offsets and cu_seqlens_k 2"):
        st.varlen_attention(q, q, q, cu, _cu([10]), 6, 10)
    with pytest.raises(ValueError, match="causal='top_left' needs every query sequence as long"):
        st.varlen_attention(q, q, q, cu, cu.clone(), 6, 6, causal="top_left")
    with pytest.raises(ValueError, match="max_seqlen_q must be an int >= 0"):
        st.varlen_attention(q, q, q, cu, cu, -1, 6)
    with pytest.raises(ValueError, match="head_dim_v 32 != head_dim 64"):
        st.varlen_attention(q, q, randn(10, 2, 32), cu, cu, 6, 6)


@two_gpus
def test_mismatched_gpus_are_refused():
    q = randn(1, 2, 16, 64)
    with pytest.raises(ValueError, match="k is on cuda:1 but q is on cuda:0"):
        st.attention(q, q.to("cuda:1"), q)
