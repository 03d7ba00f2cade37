#!/usr/bin/env python3
"""peer_kernels.py — PyTorch's cuDNN and flash backward on one problem, for
a kernel profiler to time kernel by kernel: under each backend one forward,
then its backward 1 + --repeats times (compare_torch.py's
torch_backend_bshd; the inputs' kernels run too). [B, H, S, D] tensors.

    ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        --csv python3 bench/peer_kernels.py --shape 8,16,2048 --hd 128 [--causal]

Ours on the same problem: ncu --kernel-name regex:sdpa_bwd ... build/bench/bench_bwd
--shape 8,16,2048 --hd 128 --causal 0|1.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8,16,2048", help="B,H,S")
    ap.add_argument("--hd", type=int, default=128)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    import torch
    from torch.nn.attention import SDPBackend
    b, h, s = (int(x) for x in a.shape.split(","))
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    q, k, v = (torch.randn(b, h, s, a.hd, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(b, h, s, a.hd, device="cuda", dtype=dtype)
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        backward = compare_torch.torch_backend_bshd(backend, q, k, v, dout, a.causal)[0]
        for _ in range(a.repeats):
            backward()
        torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
