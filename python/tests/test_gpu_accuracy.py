"""The backward's accuracy on a GPU by FlashAttention's criterion, over a
fixed list of random cases (skipped without PyTorch or a CUDA device).

accuracy.py has the cases, the references, the criterion and its floor
(its docstring says why they are what they are) and the reports. Here the
library is called through the package's Plan wrapper: one plan per case
from the case's descriptor (packed tensors, explicit strides), made on the
main thread (a case it refuses at plan time, NOT_SUPPORTED or an
INVALID_ARGUMENT naming the head dims, is skipped-unsupported with the
library's message and counted), compiled once per key in parallel threads
(NVRTC runs outside the GIL), then executed on torch's current stream with
the tensors' data_ptr()s, a workspace from PyTorch's allocator, dq, dk, dv
and the workspace poisoned with NaN first, and sync_check() after.

fp32 matmuls run without TF32, and low-precision GEMMs without reduced
precision reductions, while the test runs: the reference is fp32 and
PyTorch's low-precision peer accumulates in fp32.

    SDPA_JIT_ACCURACY_OUT=dir python3 -m pytest -s python/tests/test_gpu_accuracy.py

writes dir/accuracy.json and dir/accuracy.md (default: pytest's temporary
directory) and prints the summary table; SDPA_JIT_ACCURACY_CASES and
SDPA_JIT_ACCURACY_SEED change the list, and SDPA_JIT_ANY_HEAD_DIM=0 (the
runtime's default of the plan option any_head_dim) restricts the run to
the measured six head dims, the others skipped. The test fails listing
every failing case and gradient.
"""
import concurrent.futures
import contextlib
import os
import time
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the accuracy test needs it")

import accuracy  # noqa: E402
import sdpa_jit  # noqa: E402

HAS_GPU = torch.cuda.is_available()


@contextlib.contextmanager
def exact_matmuls():
    """No TF32 in fp32 matmuls, no reduced-precision reductions in fp16 /
    bf16 GEMMs; the previous settings afterwards."""
    matmul = torch.backends.cuda.matmul
    names = [n for n in ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                         "allow_bf16_reduced_precision_reduction") if hasattr(matmul, n)]
    saved = {n: getattr(matmul, n) for n in names}
    try:
        for n in names:
            setattr(matmul, n, False)
        yield
    finally:
        for n, value in saved.items():
            setattr(matmul, n, value)


def make_plans(cases, runtime, arch):
    """{index: Plan} for the cases the library takes, {index: result} for
    the others (unsupported, or an error when the refusal is not about
    what the library supports)."""
    plans, results = {}, {}
    for case in cases:
        try:
            plans[case.index] = runtime.plan(accuracy.make_desc(case, arch))
        except sdpa_jit.NotSupportedError as e:
            results[case.index] = accuracy.unsupported_result(case, f"{e.status_name}: {e.message}")
        except sdpa_jit.InvalidArgumentError as e:
            if accuracy.refuses_head_dim(e.message):
                results[case.index] = accuracy.unsupported_result(case, f"{e.status_name}: {e.message}")
            else:
                results[case.index] = accuracy.error_result(case, f"plan: {e}")
    return plans, results


def compile_plans(plans, device_index):
    """Compiles one plan per key in parallel threads (each in the device's
    primary context, where torch works); returns {key_hash: exception} of
    the keys that failed."""
    first = {}
    for plan in plans.values():
        first.setdefault(plan.key_hash, plan)

    def compile_one(plan):
        with torch.cuda.device(device_index):
            plan.compile()

    failed = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, os.cpu_count() or 1))) as pool:
        futures = {key: pool.submit(compile_one, plan) for key, plan in first.items()}
    for key, future in futures.items():
        if future.exception() is not None:
            failed[key] = future.exception()
    return failed


def ours_by(plan, device):
    """ours(case, inputs, out, lse) -> (dq, dk, dv) by sdpa_bwd_execute."""

    def run(case, inputs, out, lse):
        shapes = accuracy.tensor_shapes(case)
        ins = dict(q=inputs.q, k=inputs.k, v=inputs.v, o=out, dout=inputs.dout, lse=lse)
        for name, t in ins.items():  # the layout the descriptor declares
            assert tuple(t.shape) == shapes[name] and t.is_contiguous() and t.data_ptr() % 16 == 0, name
        dq, dk, dv = (torch.full(shapes[n], float("nan"), dtype=inputs.q.dtype, device=device)
                      for n in ("dq", "dk", "dv"))
        workspace = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device=device).fill_(255)
        assert workspace.data_ptr() % 256 == 0
        tensors = sdpa_jit.BwdTensors.init(q=inputs.q.data_ptr(), k=inputs.k.data_ptr(), v=inputs.v.data_ptr(),
                                           o=out.data_ptr(), dout=inputs.dout.data_ptr(), lse=lse.data_ptr(),
                                           dq=dq.data_ptr(), dk=dk.data_ptr(), dv=dv.data_ptr())
        if case.layout == "thd":
            tensors.update(cu_seqlens_q=inputs.cu_seqlens_q.data_ptr(),
                           cu_seqlens_kv=inputs.cu_seqlens_kv.data_ptr(),
                           total_q=case.total_q, total_kv=case.total_kv)
        stream = torch.cuda.current_stream(device).cuda_stream
        try:
            plan.execute(tensors, workspace.data_ptr(), plan.workspace_size, stream)
        except sdpa_jit.NotCompiledError:  # not loaded in this thread's context yet
            plan.compile()
            plan.execute(tensors, workspace.data_ptr(), plan.workspace_size, stream)
        plan.sync_check(stream)
        return dq, dk, dv

    return run


@pytest.mark.skipif(not HAS_GPU, reason="no CUDA device")
def test_backward_accuracy_by_flash_attention_criterion(tmp_path_factory):
    count = int(os.environ.get("SDPA_JIT_ACCURACY_CASES") or accuracy.DEFAULT_COUNT)
    seed = int(os.environ.get("SDPA_JIT_ACCURACY_SEED") or accuracy.DEFAULT_SEED)
    out_dir = os.environ.get("SDPA_JIT_ACCURACY_OUT") or str(tmp_path_factory.mktemp("accuracy"))
    cases = accuracy.generate_cases(count, seed)
    device = torch.device("cuda", torch.cuda.current_device())
    major, minor = torch.cuda.get_device_capability(device)
    arch = major * 10 + minor
    runtime = sdpa_jit.default_runtime()
    torch.cuda.init()

    start = time.perf_counter()
    plans, results = make_plans(cases, runtime, arch)
    planned = time.perf_counter()
    compile_failed = compile_plans(plans, device.index)
    compiled = time.perf_counter()
    with exact_matmuls():
        for case in cases:
            if case.index in results:
                continue
            plan = plans[case.index]
            if plan.key_hash in compile_failed:
                results[case.index] = accuracy.error_result(case, f"compile: {compile_failed[plan.key_hash]}")
                continue
            try:
                plan.compile()  # this plan object, in this thread's context: from memory now
                result = accuracy.run_case(case, ours_by(plan, device), device)
            except Exception as e:  # recorded and reported as a failure, the other cases still run
                result = accuracy.error_result(case, f"{type(e).__name__}: {e}")
            try:
                info = plan.info()
                result.update(family=info["family"].name, family_reason=info["family_reason"],
                              tiles=[info[n] for n in ("q_tile", "kv_tile", "warps", "stages")])
            except sdpa_jit.SdpaError:
                pass
            result["key_hash"] = plan.key_hash
            results[case.index] = result
            plan.destroy()
    finished = time.perf_counter()
    results = [results[c.index] for c in cases]

    meta = dict(device=torch.cuda.get_device_name(device), arch=arch, torch=torch.__version__,
                cuda=torch.version.cuda, library=sdpa_jit.library_version(), seed=seed, count=count,
                keys=len({p.key_hash for p in plans.values()}), cache=runtime.cache_path,
                seconds=dict(plan=round(planned - start, 2), compile=round(compiled - planned, 2),
                             run=round(finished - compiled, 2)))
    paths = accuracy.write_report(results, out_dir, meta)
    table = accuracy.summary_table(results)
    print("\n" + table)
    print(f"accuracy reports: {paths[0]} {paths[1]} ({meta['keys']} keys; plan {meta['seconds']['plan']} s, "
          f"compile {meta['seconds']['compile']} s, run {meta['seconds']['run']} s)")
    unsupported = [r for r in results if r["status"] == "unsupported"]
    if unsupported:
        messages = sorted({r["message"] for r in unsupported})
        warnings.warn(f"{len(unsupported)} of {len(results)} accuracy cases skipped as unsupported by the library: "
                      + "; ".join(messages[:5]) + (" ..." if len(messages) > 5 else ""))
    problems = accuracy.failure_message(results)
    assert not problems, f"{problems}\n\n{table}\nreports: {paths[1]}"
    assert accuracy.totals(results)["ran"] > 0, f"no case ran\n{table}"
