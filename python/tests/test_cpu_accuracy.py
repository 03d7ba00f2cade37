"""The accuracy test's pieces without a GPU (accuracy.py): the cases cover
what they must and are fixed by the seed; every descriptor is one the
library takes (plans for arch 90, no GPU needed) or refuses for its head
dims; the criterion and the reports; and, with PyTorch (skipped visibly
without it), the masks against sdpa_jit.h's definitions, the references
against float64, the backward formulas against autograd, THD against
per-sequence BSHD, and the whole per-case pipeline on the CPU with an
emulation of the kernels' arithmetic in place of the library: it passes,
and a wrong or unwritten element fails, named with its gradient.
"""
import json
import math

import pytest

import accuracy
import sdpa_jit

torch = accuracy.torch
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed: the reference tests need it")

CASES = accuracy.generate_cases()


# --------------------------------------------------------------- cases


def test_cases_are_fixed_by_the_seed():
    assert len(CASES) >= 300
    assert accuracy.generate_cases() == CASES
    assert accuracy.generate_cases(seed=accuracy.DEFAULT_SEED + 1) != CASES
    assert [c.index for c in CASES] == list(range(len(CASES)))
    assert len({c.seed for c in CASES}) == len(CASES)


def test_cases_cover_the_space():
    def values(field):
        return {getattr(c, field) for c in CASES}

    assert values("dtype") == set(accuracy.DTYPES)
    assert values("layout") == set(accuracy.LAYOUTS)
    assert values("mask") == set(accuracy.MASKS)
    assert values("group") == set(accuracy.GROUPS)
    assert values("deterministic") == {False, True}
    assert {(c.head_dim, c.head_dim_v) for c in CASES} == set(accuracy.HEAD_DIMS + accuracy.NEW_HEAD_DIMS)
    for c in CASES:
        assert c.heads_q % c.heads_kv == 0 and c.head_dim_v <= c.head_dim and c.head_dim % 8 == 0
        assert c.work() <= accuracy.WORK_LIMIT, c.name
        assert any(lq and lk for lq, lk in c.sequences()), c.name
    bshd = [c for c in CASES if c.layout == "bshd"]
    thd = [c for c in CASES if c.layout == "thd"]
    for n in (1, 7, 97, 573):
        assert any(c.seqlen_q == n for c in bshd) and any(c.seqlen_kv == n for c in bshd), n
    assert sum(c.seqlen_q != c.seqlen_kv for c in bshd) >= len(bshd) // 2
    assert any(c.seqlen_q == c.seqlen_kv for c in bshd)
    assert any(0 in c.lens_q for c in thd) and any(0 in c.lens_kv for c in thd)
    assert any(1 in c.lens_q for c in thd) and any(1 in c.lens_kv for c in thd)
    assert any(c.lens_q != c.lens_kv for c in thd) and any(c.lens_q == c.lens_kv for c in thd)
    assert any(len(c.lens_q) == 1 for c in thd) and any(len(c.lens_q) >= 4 for c in thd)
    windows = [c for c in CASES if c.mask == "window"]
    assert {c.window_left for c in windows} == set(accuracy.WINDOW_SIDES)
    assert {c.window_right for c in windows} == set(accuracy.WINDOW_SIDES)
    for c in CASES:
        if c.mask != "window":
            assert c.window_left == c.window_right == -1
    # each cell of dtype x mask x layout, and each head dim in each dtype, is reached
    assert len({(c.dtype, c.mask, c.layout) for c in CASES}) == 16
    assert len({(c.dtype, c.head_dim, c.head_dim_v) for c in CASES}) == 2 * len(accuracy.HEAD_DIMS +
                                                                                 accuracy.NEW_HEAD_DIMS)
    # most cases are on the measured head dims
    assert sum((c.head_dim, c.head_dim_v) in accuracy.HEAD_DIMS for c in CASES) >= 0.6 * len(CASES)


def test_case_names_say_what_the_case_is():
    c = accuracy.Case(index=7, seed=1, dtype="bf16", layout="thd", mask="window", window_left=7, window_right=-1,
                      heads_kv=2, group=4, head_dim=192, head_dim_v=128, deterministic=True,
                      lens_q=(37, 0, 1), lens_kv=(5, 9, 0))
    assert c.name == "#007 bf16 thd q=37,0,1 kv=5,9,0 H8/2 D192/128 window(7,-1) det"
    assert c.segments() == [(0, 37, 0, 5), (37, 37, 5, 14), (37, 38, 14, 14)]
    assert (c.total_q, c.total_kv, c.max_q, c.max_kv) == (38, 14, 37, 9)
    assert json.loads(json.dumps(c.as_dict()))["name"] == c.name


# --------------------------------------------------------- descriptors


@pytest.fixture(scope="module")
def runtime():
    rt = sdpa_jit.Runtime(arch=90, disable_disk_cache=True)
    yield rt
    rt.close()


def test_descriptors_are_taken_or_refused_for_their_head_dims(runtime):
    """Every case's descriptor makes a plan, unless the library refuses its
    head dims: only the ones it is to accept, with a message that says so
    (the GPU test reports those as unsupported)."""
    keys, refused = set(), []
    for c in CASES:
        try:
            plan = runtime.plan(accuracy.make_desc(c, 90))
        except sdpa_jit.NotSupportedError as e:
            refused.append((c, e.message))
            continue
        except sdpa_jit.InvalidArgumentError as e:
            assert accuracy.refuses_head_dim(e.message), f"{c.name}: {e}"
            refused.append((c, e.message))
            continue
        assert plan.workspace_size > 0
        keys.add(plan.key_hash)
        plan.destroy()
    for c, message in refused:
        assert (c.head_dim, c.head_dim_v) in accuracy.NEW_HEAD_DIMS, f"{c.name}: refused: {message}"
    # cases share kernels (generate_cases' classes): compiling stays a fraction of the run
    assert 50 <= len(keys) <= len(CASES) // 2
    print(f"{len(CASES)} cases, {len(refused)} refused for their head dims, {len(keys)} distinct keys")


def test_descriptor_fields():
    thd = accuracy.Case(index=0, seed=1, dtype="fp16", layout="thd", mask="causal_br", window_left=-1,
                        window_right=-1, heads_kv=2, group=4, head_dim=64, head_dim_v=64, deterministic=True,
                        lens_q=(37, 0, 1), lens_kv=(5, 9, 0))
    d = accuracy.make_desc(thd, 90)
    assert (d.layout, d.dtype, d.batch, d.seqlen_q, d.seqlen_kv, d.max_total_q, d.max_total_kv) == \
        (sdpa_jit.Layout.THD, sdpa_jit.Dtype.FP16, 3, 37, 9, 38, 14)
    assert (d.heads_q, d.heads_kv, d.mask, d.deterministic, d.arch) == (8, 2, sdpa_jit.Mask.CAUSAL_BOTTOM_RIGHT,
                                                                        1, 90)
    assert (d.q.batch, d.q.seq, d.q.head) == (0, 8 * 64, 64)       # [T, H, D]
    assert (d.k.batch, d.k.seq, d.k.head) == (0, 2 * 64, 64)
    assert (d.lse.batch, d.lse.head, d.lse.seq) == (0, 38, 1)       # [H, T]
    assert math.isclose(d.scale, 1 / 8)
    bshd = accuracy.Case(index=0, seed=1, dtype="bf16", layout="bshd", mask="window", window_left=7,
                         window_right=0, heads_kv=1, group=2, head_dim=128, head_dim_v=64, deterministic=False,
                         batch=3, seqlen_q=97, seqlen_kv=33)
    d = accuracy.make_desc(bshd, 90)
    assert (d.layout, d.batch, d.seqlen_q, d.seqlen_kv, d.head_dim, d.head_dim_v) == \
        (sdpa_jit.Layout.BSHD, 3, 97, 33, 128, 64)
    assert (d.mask, d.window_left, d.window_right) == (sdpa_jit.Mask.SLIDING_WINDOW, 7, 0)
    assert (d.q.batch, d.q.seq, d.q.head) == (97 * 2 * 128, 2 * 128, 128)   # [B, S, H, D]
    assert (d.v.batch, d.v.seq, d.v.head) == (33 * 64, 64, 64)
    assert (d.dout.batch, d.dout.seq, d.dout.head) == (97 * 2 * 64, 2 * 64, 64)
    assert (d.lse.batch, d.lse.head, d.lse.seq) == (2 * 97, 97, 1)          # [B, H, S]
    assert accuracy.tensor_shapes(bshd)["lse"] == (3, 2, 97)


# ----------------------------------------------------------- criterion


def test_judge_holds_each_peer_to_its_ratio_plus_the_floor():
    v = accuracy.judge(ours=1.25e-2, torch_lowp=1e-1, flash=1e-2, floor=0.0)
    assert v["passed"] and v["against"] == "flash" and v["limit"] == pytest.approx(1.25e-2)
    assert not accuracy.judge(ours=1.26e-2, torch_lowp=1e-1, flash=1e-2, floor=0.0)["passed"]
    assert accuracy.judge(ours=1.26e-2, torch_lowp=1e-1, flash=1e-2, floor=1e-4)["passed"]
    v = accuracy.judge(ours=2e-2, torch_lowp=1e-2, flash=None, floor=0.0)
    assert v["passed"] and v["against"] == "torch" and v["ratio_torch"] == pytest.approx(2.0)
    assert v["ratio_flash"] is None
    assert not accuracy.judge(ours=2.01e-2, torch_lowp=1e-2, flash=None, floor=0.0)["passed"]
    # both exact: only exact passes; a peer error of 0 leaves the ratio undefined
    v = accuracy.judge(ours=0.0, torch_lowp=0.0, flash=None, floor=0.0)
    assert v["passed"] and v["ratio_torch"] is None and v["margin"] == 0.0
    assert not accuracy.judge(ours=1e-9, torch_lowp=0.0, flash=None, floor=0.0)["passed"]
    assert accuracy.judge(ours=1e-9, torch_lowp=0.0, flash=None, floor=2e-9)["passed"]
    # an unwritten element (NaN: inf error) fails whatever the limit
    assert not accuracy.judge(ours=math.inf, torch_lowp=1.0, flash=None, floor=1.0)["passed"]


def _result(name, status, dtype="bf16", mask="none", d=64, dv=64, ours=1e-2, flash=1e-2, torch_lowp=3e-2,
            flash_state="ran"):
    case = dict(dtype=dtype, mask=mask, head_dim=d, head_dim_v=dv, name=name)
    grads = {}
    if status in ("pass", "fail"):
        for g in accuracy.GRADS:
            grads[g] = accuracy.judge(ours, torch_lowp, flash, 0.0)
            grads[g]["max_ref"] = 1.0
    return dict(case=case, name=name, status=status, message="msg" if status != "pass" else "",
                flash=flash_state, grads=grads)


def test_reports_list_buckets_worst_cases_failures_and_unsupported(tmp_path):
    results = [
        _result("#000 a", "pass", ours=1e-2, flash=1e-2),
        _result("#001 b", "pass", ours=0.5e-2, flash=1e-2),
        _result("#002 c", "fail", ours=2e-2, flash=1e-2),
        _result("#003 d", "pass", dtype="fp16", mask="window", d=192, dv=128, flash=None,
                flash_state="mask other than none or top-left causal"),
        _result("#004 e", "fail", dtype="fp16", mask="causal_br", ours=1.0, flash=None, flash_state="refused"),
        _result("#005 f", "unsupported", d=80, dv=80),
        _result("#006 g", "error"),
    ]
    results[4]["grads"]["dq"] = accuracy.judge(math.inf, 1e-2, None, 0.0)
    json_path, md_path = accuracy.write_report(results, str(tmp_path / "out"), dict(seed=5))
    doc = json.load(open(json_path))
    assert doc["totals"] == dict(cases=7, ran=5, passed=3, failed=2, unsupported=1, errors=1, against_flash=3)
    assert doc["meta"] == {"seed": 5} and "1.25 x flash" in doc["criterion"]
    assert doc["cases"][4]["grads"]["dq"]["ours"] == "inf"
    bucket = next(b for b in doc["buckets"] if (b["dtype"], b["mask"], b["dims"]) == ("bf16", "none", "64"))
    assert (bucket["cases"], bucket["failed"], bucket["flash_cases"]) == (3, 1, 3)
    assert bucket["flash_median"] == pytest.approx(1.0) and bucket["flash_max"] == pytest.approx(2.0)
    assert bucket["worst"].startswith("#002 c")
    assert any(b["dims"] == "192/128" for b in doc["buckets"])
    md = open(md_path).read()
    for text in ("## Buckets", "## Worst cases", "## Failures", "## Skipped: unsupported by the library",
                 "| bf16 | none | 64 | 3 | 1 | 3 |", "#005 f", "- 1 x `msg`", "- 1: refused"):
        assert text in md, text
    message = accuracy.failure_message(results)
    assert message.startswith("2 of 5 cases failed the criterion")
    for text in ("#002 c dq", "#002 c dk", "#002 c dv", "#004 e dq: ours inf", "#004 e dk", "#006 g: error: msg"):
        assert text in message, text
    assert "#000" not in message and "#003" not in message
    table = accuracy.summary_table(results)
    assert table.splitlines()[0] == \
        "accuracy: 7 cases: 5 ran (3 against flash), 1 unsupported, 2 failed, 1 errors"
    assert len(table.splitlines()) == 2 + 3 + 1
    assert table.splitlines()[-1] == "given ref32's O and LSE instead of flash's: not measured"
    assert accuracy.failure_message([_result("#000 a", "pass")]) == ""


# ---------------------------------------------------------- references


def _case(**fields):
    base = dict(index=0, seed=12345, dtype="bf16", layout="bshd", mask="none", window_left=-1, window_right=-1,
                heads_kv=2, group=2, head_dim=32, head_dim_v=32, deterministic=False)
    base.update(fields)
    return accuracy.Case(**base)


SMALL = [
    _case(batch=2, seqlen_q=33, seqlen_kv=16, mask="causal_tl"),
    _case(batch=1, seqlen_q=33, seqlen_kv=16, mask="causal_br", group=4, head_dim=64, head_dim_v=32),
    _case(batch=2, seqlen_q=7, seqlen_kv=64, mask="window", window_left=3, window_right=0, dtype="fp16"),
    _case(batch=1, seqlen_q=16, seqlen_kv=16, heads_kv=1, group=8, head_dim=40, head_dim_v=40),
    _case(batch=2, seqlen_q=1, seqlen_kv=7, mask="causal_tl", dtype="fp16"),        # dq, dk exactly 0
    _case(batch=3, seqlen_q=16, seqlen_kv=1, dtype="fp16", head_dim=16, head_dim_v=16),  # P = 1: cancels
    _case(layout="thd", lens_q=(7, 0, 16, 1, 5), lens_kv=(7, 3, 16, 0, 9), mask="causal_br"),
    _case(layout="thd", lens_q=(33, 1), lens_kv=(33, 1), mask="window", window_left=0, window_right=0,
          dtype="fp16"),
    _case(layout="thd", lens_q=(12, 20), lens_kv=(30, 5), mask="causal_tl", group=1, head_dim=72,
          head_dim_v=72),
]


@needs_torch
@pytest.mark.parametrize("mask", accuracy.MASKS)
def test_visible_follows_the_header(mask):
    for sq, skv in ((1, 1), (5, 9), (9, 5), (7, 7)):
        for left, right in ((-1, -1), (0, 0), (2, -1), (-1, 1), (3, 2)) if mask == "window" else ((-1, -1),):
            ok = accuracy.visible(sq, skv, mask, left, right)
            off = skv - sq
            for i in range(sq):
                for j in range(skv):
                    expected = {"none": True, "causal_tl": j <= i, "causal_br": j <= i + off,
                                "window": (left < 0 or j >= i + off - left) and (right < 0 or j <= i + off + right)
                                }[mask]
                    assert bool(ok[i, j]) == expected, (mask, sq, skv, left, right, i, j)


@needs_torch
@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.name)
def test_reference_against_float64(case):
    """ref32's O, LSE and gradients are float64's to fp32 accuracy; rows
    that see no key have LSE -inf and O, dQ 0; keys no query sees dK, dV 0."""
    inputs = accuracy.make_inputs(case, "cpu")
    out32, lse32, g32 = accuracy.gradients(case, inputs, accuracy.attend, torch.float32, want_lse=True)
    out64, lse64, g64 = accuracy.gradients(case, inputs, accuracy.attend, torch.float64, want_lse=True)
    shapes = accuracy.tensor_shapes(case)
    assert tuple(out32.shape) == shapes["o"] and tuple(lse32.shape) == shapes["lse"]
    assert lse32.dtype == torch.float32 and lse32.is_contiguous()
    for a, b in [(out32, out64)] + list(zip(g32, g64)):
        assert torch.isfinite(a).all()
        assert (a.double() - b).abs().max().item() <= 1e-5 * max(1.0, b.abs().max().item())
    seen = torch.isfinite(lse64)
    assert torch.equal(seen, torch.isfinite(lse32)) and bool((lse64[~seen] == float("-inf")).all())
    assert (lse32.double()[seen] - lse64[seen]).abs().max().item() <= 1e-5
    # the LSE is the natural log of the row's sum over its visible keys
    if case.layout == "bshd":
        ok = accuracy.visible(case.seqlen_q, case.seqlen_kv, case.mask, case.window_left, case.window_right)
        q = inputs.q.double().transpose(1, 2)
        k = inputs.k.double().transpose(1, 2).repeat_interleave(case.group, dim=1)
        s = torch.matmul(q, k.transpose(-1, -2)) * case.scale
        direct = torch.log(torch.where(ok, torch.exp(s), torch.zeros_like(s)).sum(-1))
        assert torch.allclose(direct, lse64, rtol=0, atol=1e-9)
        rows = ~ok.any(dim=-1)
        assert bool((out32.transpose(1, 2)[:, :, rows] == 0).all()) and bool((g32[0].transpose(1, 2)[:, :, rows]
                                                                             == 0).all())
    else:
        for q0, q1, k0, k1 in case.segments():
            if k1 == k0:
                assert bool((out32[q0:q1] == 0).all()) and bool((g32[0][q0:q1] == 0).all())
                assert bool((lse32[:, q0:q1] == float("-inf")).all())
            if q1 == q0:
                assert bool((g32[1][k0:k1] == 0).all()) and bool((g32[2][k0:k1] == 0).all())


@needs_torch
@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.name)
def test_backward_formulas_are_autograds_gradients(case):
    """formula_gradients (FlashAttention's backward) equals autograd's
    gradients in float64, GQA and masks included."""
    inputs = accuracy.make_inputs(case, "cpu")
    out64, lse64, g64 = accuracy.gradients(case, inputs, accuracy.attend, torch.float64, want_lse=True)
    q, k, v, dout = (x.double() for x in (inputs.q, inputs.k, inputs.v, inputs.dout))
    for a, b in zip(_formula64(case, q, k, v, dout, out64, lse64), g64):
        assert (a - b).abs().max().item() <= 1e-10 * max(1.0, b.abs().max().item())
    # as the floor uses them: in fp32, from fp32's O and LSE
    out32, lse32, _ = accuracy.gradients(case, inputs, accuracy.attend, torch.float32, want_lse=True)
    for a, b in zip(accuracy.formula_gradients(case, inputs, out32, lse32), g64):
        assert a.dtype == torch.float32
        assert (a.double() - b).abs().max().item() <= 1e-5 * max(1.0, b.abs().max().item())


def _formula64(case, q, k, v, dout, out, lse):
    """formula_gradients' blocks in float64 (its code, another dtype)."""
    ident = lambda x: x  # noqa: E731
    if case.layout == "bshd":
        ok = accuracy.visible(case.seqlen_q, case.seqlen_kv, case.mask, case.window_left, case.window_right)
        grads = accuracy._formula_block(*(x.transpose(1, 2) for x in (q, k, v, out, dout)), lse, ok, case.scale,
                                        ident)
        return [g.transpose(1, 2) for g in grads]
    grads = [torch.zeros_like(x) for x in (q, k, v)]
    for q0, q1, k0, k1 in case.segments():
        if q1 == q0 or k1 == k0:
            continue
        ok = accuracy.visible(q1 - q0, k1 - k0, case.mask, case.window_left, case.window_right)
        blocks = [x.transpose(0, 1)[None] for x in (q[q0:q1], k[k0:k1], v[k0:k1], out[q0:q1], dout[q0:q1])]
        dq, dk, dv = accuracy._formula_block(*blocks, lse[:, q0:q1][None], ok, case.scale, ident)
        grads[0][q0:q1], grads[1][k0:k1], grads[2][k0:k1] = (g[0].transpose(0, 1) for g in (dq, dk, dv))
    return grads


@needs_torch
def test_thd_reference_is_the_per_sequence_bshd_reference():
    case = SMALL[6]
    inputs = accuracy.make_inputs(case, "cpu")
    out, lse, grads = accuracy.gradients(case, inputs, accuracy.attend, torch.float32, want_lse=True)
    for s, (q0, q1, k0, k1) in enumerate(case.segments()):
        if q1 == q0 or k1 == k0:
            continue
        one = _case(batch=1, seqlen_q=q1 - q0, seqlen_kv=k1 - k0, mask=case.mask, heads_kv=case.heads_kv,
                    group=case.group, head_dim=case.head_dim, head_dim_v=case.head_dim_v)
        sliced = accuracy.Inputs(inputs.q[q0:q1][None], inputs.k[k0:k1][None], inputs.v[k0:k1][None],
                                 inputs.dout[q0:q1][None])
        o1, l1, g1 = accuracy.gradients(one, sliced, accuracy.attend, torch.float32, want_lse=True)
        assert torch.allclose(out[q0:q1], o1[0], atol=1e-6)
        assert torch.allclose(lse[:, q0:q1], l1[0], atol=1e-6)
        for whole, part, (a, b) in zip(grads, g1, ((q0, q1), (k0, k1), (k0, k1))):
            assert torch.allclose(whole[a:b], part[0], atol=1e-6), s


@needs_torch
def test_flash_attend_takes_only_the_masks_flash_has():
    case = _case(batch=1, seqlen_q=16, seqlen_kv=16)
    inputs = accuracy.make_inputs(case, "cpu")
    q, k, v = (x.transpose(1, 2) for x in (inputs.q, inputs.k, inputs.v))
    for ok in (accuracy.visible(16, 16, "window", 3, 0), accuracy.visible(16, 12, "causal_br")):
        with pytest.raises(accuracy.FlashNotApplicable, match="mask other than none or top-left causal"):
            accuracy.flash_attend(q, k[:, :, :ok.shape[1]], v[:, :, :ok.shape[1]], ok, case.scale)
    with pytest.raises(accuracy.FlashNotApplicable, match="head_dim_v != head_dim"):
        accuracy.flash_attend(q, k, v[..., :16], accuracy.visible(16, 16, "none"), case.scale)
    # none, and top-left causal (which bottom-right is at equal lengths), where
    # this PyTorch has a flash kernel for the device
    for mask in ("none", "causal_tl", "causal_br"):
        ok = accuracy.visible(16, 16, mask)
        try:
            out, _ = accuracy.flash_attend(q, k, v, ok, case.scale)
        except accuracy.FlashNotApplicable as e:
            assert str(e).startswith("refused: ")
            continue
        ref, _ = accuracy.attend(q.float(), k.float(), v.float(), ok, case.scale)
        assert (out.float() - ref).abs().max().item() <= 2 ** -6 * ref.abs().max().item()


# ------------------------------------------------------------ pipeline


def _emulated_kernel(case, inputs, out, lse):
    """The kernels' arithmetic on the CPU: fp32 with P and dS rounded to the
    dtype before their products (formula_gradients)."""
    return accuracy.formula_gradients(case, inputs, out, lse, round_to=accuracy.torch_dtype(case.dtype))


@needs_torch
def test_pipeline_passes_the_kernels_arithmetic():
    results = [accuracy.run_case(c, _emulated_kernel, "cpu", use_flash=False) for c in SMALL]
    assert accuracy.failure_message(results) == "", accuracy.failure_message(results)
    for r in results:
        assert r["status"] == "pass" and r["flash"] == "not tried"
        scale = max(m["max_ref"] for m in r["grads"].values())
        for m in r["grads"].values():
            # the twin's disagreement, or fp32's resolution at the case's scale
            assert m["against"] == "torch" and m["floor"] < max(1e-3 * max(m["max_ref"], 1e-3) + 1e-5,
                                                                1.001 * accuracy.FP32_RESOLUTION * scale)
    # the cancelling cases: ref32 is exactly 0, the floor is fp32 noise
    for r in results[4:6]:
        for g in ("dq", "dk"):
            m = r["grads"][g]
            assert m["max_ref"] < 1e-5 and m["floor"] < 1e-4, (r["name"], g, m)


@needs_torch
def test_pipeline_fails_a_wrong_or_unwritten_element_naming_the_gradient():
    def wrong(case, inputs, out, lse):
        dq, dk, dv = _emulated_kernel(case, inputs, out, lse)
        dk = dk.clone()
        dk.view(-1)[dk.numel() // 2] += 0.25 * max(1.0, dk.float().abs().max().item())
        return dq, dk, dv

    def unwritten(case, inputs, out, lse):
        dq, dk, dv = _emulated_kernel(case, inputs, out, lse)
        dv = dv.clone()
        dv.view(-1)[-1] = float("nan")
        return dq, dk, dv

    results = [accuracy.run_case(SMALL[0], wrong, "cpu", use_flash=False),
               accuracy.run_case(SMALL[6], unwritten, "cpu", use_flash=False),
               accuracy.run_case(SMALL[3], _emulated_kernel, "cpu", use_flash=False)]
    assert [r["status"] for r in results] == ["fail", "fail", "pass"]
    assert [g for g, m in results[0]["grads"].items() if not m["passed"]] == ["dk"]
    assert [g for g, m in results[1]["grads"].items() if not m["passed"]] == ["dv"]
    message = accuracy.failure_message(results)
    assert message.startswith("2 of 3 cases failed")
    assert f"{SMALL[0].name} dk: ours" in message and f"{SMALL[6].name} dv: ours inf" in message
    assert SMALL[3].name not in message


@needs_torch
def test_against_flash_ours_is_judged_given_flashs_own_output(monkeypatch):
    """Where flash runs, the backward under test gets the O and LSE flash's
    own backward read (its forward's), and is judged on that; the run given
    ref32's is recorded beside it. A stand-in flash (attention in the
    dtype) on the CPU: its O differs from ref32's rounded one."""
    monkeypatch.setattr(accuracy, "flash_attend", accuracy.attend)
    given = []

    def recording(case, inputs, out, lse):
        given.append((out.clone(), lse.clone()))
        return _emulated_kernel(case, inputs, out, lse)

    for case in (SMALL[0], SMALL[8]):  # BSHD causal, THD
        given.clear()
        r = accuracy.run_case(case, recording, "cpu")
        assert r["flash"] == "ran" and r["o_given"] == "flash with its LSE", r["flash"]
        dtype = accuracy.torch_dtype(case.dtype)
        out32, lse32, ref = accuracy.gradients(case, accuracy.make_inputs(case, "cpu"), accuracy.attend,
                                               torch.float32, want_lse=True)
        out_fl, lse_fl, _ = accuracy.gradients(case, accuracy.make_inputs(case, "cpu"), accuracy.attend, dtype,
                                               want_lse=True)
        assert len(given) == 2
        assert torch.equal(given[0][0], out32.to(dtype)) and torch.equal(given[0][1], lse32)
        assert torch.equal(given[1][0], out_fl) and torch.equal(given[1][1], lse_fl)
        assert not torch.equal(given[0][0], given[1][0])  # the two O really differ
        judged = _emulated_kernel(case, accuracy.make_inputs(case, "cpu"), out_fl, lse_fl)
        kept = _emulated_kernel(case, accuracy.make_inputs(case, "cpu"), out32.to(dtype), lse32)
        for i, g in enumerate(accuracy.GRADS):
            m = r["grads"][g]
            assert m["ours"] == accuracy.max_error(judged[i], ref[i])
            assert m["ours_ref32_o"] == accuracy.max_error(kept[i], ref[i])
            assert m["rms"]["ours"] == accuracy.rms_error(judged[i], ref[i]) and m["rms"]["flash"] is not None
    assert "given ref32's O and LSE instead of flash's (not judged)" in accuracy.summary_table([r])
