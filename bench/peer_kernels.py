#!/usr/bin/env python3
"""peer_kernels.py — PyTorch's cuDNN and flash backward on one problem, two
backwards each, for a kernel profiler to time kernel by kernel (the
forward and the inputs' kernels run too; the backward's are the three
between two forwards). [B, H, S, D] tensors.

    ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        --csv python3 bench/peer_kernels.py --shape 8,16,2048 --hd 128 [--causal]

Ours on the same problem: ncu --kernel-name regex:sdpa_bwd ... build/bench/bench_bwd
--shape 8,16,2048 --hd 128 --causal 0|1.
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8,16,2048", help="B,H,S")
    ap.add_argument("--hd", type=int, default=128)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    b, h, s = (int(x) for x in a.shape.split(","))
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    q, k, v = (torch.randn(b, h, s, a.hd, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    g = torch.randn(b, h, s, a.hd, device="cuda", dtype=dtype)
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel(backend):
            for _ in range(a.repeats):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=a.causal)
                o.backward(g)
                torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
