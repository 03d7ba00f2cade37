#!/usr/bin/env python3
"""train_gpt.py -- a small GPT trained with PyTorch's attention and with
sdpa_jit.torch.attention (PyTorch's forward, sdpa-jit's backward).

The data ships with Python: the text of pydoc_data/topics.py (Python's
help topics), as bytes (a 256-token vocabulary), 95% for training and 5%
held out. The model: token and position embeddings, N pre-norm blocks
(causal self-attention over q, k, v viewed from one packed projection,
then a 4x GELU MLP), tied output embedding. bf16 autocast, AdamW, warmup
then cosine decay, gradient clipping.

One GPU: trains once per --attention variant from the same seed (same
initial weights, same batches): torch (F.scaled_dot_product_attention,
PyTorch's default kernels) and sdpa_jit (sdpa_jit.torch.attention;
sdpa_jit:cudnn takes PyTorch's cuDNN forward instead of FlashAttention's),
and prints each run's median step time and tokens/s, the final losses
(mean of the last 20 steps) and whether each sdpa_jit run agrees with
torch's within --tolerance (1%); writes the loss curves to a PNG and the
numbers to a JSON file. --profile first times the attention alone at the
model's shape for each variant (and names PyTorch's default backend).

Several processes (torchrun --nproc_per_node N): DistributedDataParallel,
NCCL when every rank has its own GPU, else gloo (ranks sharing a GPU);
the script says which. Each rank takes its 1/N share of the single run's
batch (the same sequences), and the loss curve is the mean over the ranks,
so the run follows the one-GPU run's curve. With --attention sdpa_jit and
SDPA_JIT_CACHE naming one cache file for all ranks (empty at the start),
every kernel key must be compiled exactly once across the ranks: rank 0
gathers each rank's compile records (the source of every compile: COMPILED
by NVRTC, DISK from the shared file, MEMORY) and the cache's rows and
prints them; the run fails if a key was compiled by NVRTC more or less
than once, or the cache holds other rows. --compare FILE checks the final
loss against a one-GPU run's JSON (within --tolerance).

  python3 examples/train_gpt.py [--steps 300] [--out DIR]
  SDPA_JIT_CACHE=/tmp/c/kernels.sqlite torchrun --nproc_per_node 2 examples/train_gpt.py \\
      --attention sdpa_jit --compare DIR/train_single.json
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def load_text():
    """Python's help topics as bytes (the stdlib's pydoc_data), else the
    source of a few stdlib modules."""
    try:
        from pydoc_data import topics
        text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
        source = "pydoc_data/topics.py"
    except ImportError:
        import inspect
        import json as j, email, argparse as a
        text = "\n".join(inspect.getsource(m) for m in (j, email, a))
        source = "stdlib sources"
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8), source


class Attention(nn.Module):
    def __init__(self, d_model, heads, kind):
        super().__init__()
        self.heads, self.kind = heads, kind
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        if kind != "torch":
            from sdpa_jit.torch import attention
            self.sdpa_jit_attention = attention

    def forward(self, x):
        b, t, c = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, c // self.heads)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B, H, T, D] views
        if self.kind == "torch":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = self.sdpa_jit_attention(q, k, v, causal="top_left")
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, d_model, heads, kind):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads, kind)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model, bias=False), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model, bias=False))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, d_model, heads, kind):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, kind) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx, targets):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.ln(x) @ self.tok.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def batches(data, batch, context, seed, device, part=0, parts=1):
    """Random windows of `context` bytes: `batch` of them a step, the same
    for any number of `parts` (ranks), of which this yields part `part`."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, data.numel() - context - 1, (batch,), generator=gen)
        starts = starts.view(parts, -1)[part]
        x = torch.stack([data[s:s + context] for s in starts.tolist()]).long()
        y = torch.stack([data[s + 1:s + context + 1] for s in starts.tolist()]).long()
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def use_forward(kind):
    """sdpa_jit:<forward> picks PyTorch's forward kernel for sdpa_jit."""
    if kind.startswith("sdpa_jit"):
        import sdpa_jit.torch as st
        st.forward_backend = kind.split(":", 1)[1] if ":" in kind else "auto"


def train(kind, args, data, device, rank=0, world=1, ddp=False):
    use_forward(kind)
    torch.manual_seed(args.seed)
    model = GPT(256, args.context, args.layers, args.d_model, args.heads, kind).to(device)
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    step_fn = model
    if args.compile:
        step_fn = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    split = int(data.numel() * 0.95)
    train_data, held_out = data[:split], data[split:]
    local_batch = args.batch // world
    it = batches(train_data, args.batch, args.context, args.seed, device, rank, world)
    losses = torch.zeros(args.steps, device=device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps)]
    warmup = max(1, args.steps // 10)
    wall = time.perf_counter()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = max(lr, args.lr * 0.05)
        x, y = next(it)
        starts[step].record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ends[step].record()
        losses[step] = loss.detach()
        if rank == 0 and args.log_every and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"  [{kind}] step {step:4d} loss {loss.item():.4f}{' (rank 0)' if ddp else ''}", flush=True)
    torch.cuda.synchronize(device)
    wall = time.perf_counter() - wall
    if ddp:  # each rank's loss is the mean over its equal share: their mean is the global batch's
        import torch.distributed as dist
        dist.all_reduce(losses)
        losses /= world
    times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
    skip = min(args.steps - 1, max(5, args.steps // 10))  # warm-up steps (compiles) are not timed
    step_ms = statistics.median(times[skip:])
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        held = batches(held_out, args.batch, args.context, args.seed + 7, device, rank, world)
        held_loss = statistics.mean(step_fn(*next(held)).item() for _ in range(8))
    curve = losses.tolist()
    tail = min(20, args.steps)
    return {"attention": kind, "losses": curve, "final_loss": statistics.mean(curve[-tail:]),
            "held_out_loss": held_loss, "step_ms": step_ms,
            "tokens_per_s": args.batch * args.context / (step_ms / 1e3),
            "wall_s": wall, "first_step_ms": times[0]}


def profile_attention(args, device, runs=20):
    """The attention alone at the model's shape ([B, H, S, D] views of a
    packed qkv projection, causal): PyTorch's default backend, and the
    event-timed forward and forward+backward of each variant (median of
    `runs`). Returns rows (name, fwd ms, fwd+bwd ms)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import sdpa_jit.torch as st
    b, h, s, d = args.batch, args.heads, args.context, args.d_model // args.heads
    qkv = torch.randn(b, s, 3, h, d, dtype=torch.bfloat16, device=device, requires_grad=True)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    dout = torch.randn(b, h, s, d, dtype=torch.bfloat16, device=device).transpose(1, 2).contiguous().transpose(1, 2)
    try:
        default = SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True)).name
    except Exception as e:  # private API
        default = f"unknown ({e})"

    def sdpa(backend):
        def f():
            if backend is None:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return f

    def ours(forward):
        def f():
            st.forward_backend = forward
            return st.attention(q, k, v, causal="top_left")
        return f

    variants = [("torch default", sdpa(None)), ("torch flash", sdpa(SDPBackend.FLASH_ATTENTION)),
                ("torch cudnn", sdpa(SDPBackend.CUDNN_ATTENTION)), ("sdpa_jit (auto)", ours("auto")),
                ("sdpa_jit fwd=flash", ours("flash")), ("sdpa_jit fwd=cudnn", ours("cudnn"))]

    def time_ms(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize(device)
        start = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        end = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        for i in range(runs):
            start[i].record()
            fn()
            end[i].record()
        torch.cuda.synchronize(device)
        return statistics.median(a.elapsed_time(e) for a, e in zip(start, end))

    rows = []
    for name, f in variants:
        try:
            with torch.no_grad():
                fwd = time_ms(f)

            def step(f=f):
                qkv.grad = None
                f().backward(dout)
            rows.append((name, fwd, time_ms(step)))
        except RuntimeError as e:
            rows.append((name, float("nan"), float("nan")))
            print(f"  {name}: {str(e).splitlines()[0][:100]}")
    st.forward_backend = "auto"
    print(f"attention alone: B {b}, H {h}, S {s}, D {d}, causal, bf16, qkv-packed views; PyTorch's default "
          f"backend: {default}")
    print(f"  {'variant':<20} {'fwd ms':>8} {'fwd+bwd ms':>11} {'bwd ms':>8}")
    for name, fwd, total in rows:
        print(f"  {name:<20} {fwd:8.3f} {total:11.3f} {total - fwd:8.3f}")
    tiles = []
    if args.tiles_sweep:
        # sdpa-jit's backward alone with other tiles (plan options)
        with torch.no_grad():
            out, lse = st._forward_dense(q, k, v, 1, -1, -1, d ** -0.5)
        for config in [None] + args.tiles_sweep.split(";"):
            if config:
                st.set_plan_options(**dict(zip(("q_tile", "kv_tile", "warps", "stages"),
                                               map(int, config.split(",")))))
            else:
                st.set_plan_options()
            try:
                bwd = time_ms(lambda: st._backward_dense(dout, q, k, v, out, lse, 1, -1, -1, d ** -0.5, False))
                key = st.compile_records()[-1]["key"]
                tiles.append((config or "table", bwd, key))
            except Exception as e:
                tiles.append((config or "table", float("nan"), str(e).splitlines()[0][:120]))
        st.set_plan_options()
        print("  sdpa-jit backward alone by tiles (q_tile,kv_tile,warps,stages):")
        for config, bwd, key in tiles:
            print(f"    {config:<14} {bwd:8.3f} ms  {key}")
    return {"default_backend": default, "rows": rows, "tiles": tiles}


def plot(results, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in results:
        ax.plot(r["losses"], label=f"{r['attention']}: final {r['final_loss']:.4f}, {r['step_ms']:.1f} ms/step",
                linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats / byte)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def cache_report(records_by_rank, rank_count):
    """Rank 0: every key's compile sources across the ranks, and the shared
    cache's rows. Returns (ok, lines)."""
    import sdpa_jit
    lines, ok = [], True
    keys = {}
    for rank, records in enumerate(records_by_rank):
        for r in records:
            keys.setdefault(r["key"], []).append((rank, r["source"], r["seconds"]))
    rows = sdpa_jit.default_runtime().cache_list()
    cache_path = sdpa_jit.default_runtime().cache_path
    lines.append(f"shared cache {cache_path}: {len(rows)} entries; {len(keys)} distinct keys asked for by "
                 f"{rank_count} ranks")
    for key, uses in sorted(keys.items()):
        compiled = sum(1 for _, source, _ in uses if source == "COMPILED")
        detail = ", ".join(f"rank {rank}: {source} {sec * 1e3:.0f} ms" for rank, source, sec in uses)
        lines.append(f"  compiled {compiled}x  {key}  ({detail})")
        if compiled != 1:
            ok = False
    row_keys = {r.key_text for r in rows}
    if row_keys != set(keys):
        ok = False
        lines.append(f"  cache rows differ from the keys asked for: extra {sorted(row_keys - set(keys))}, "
                     f"missing {sorted(set(keys) - row_keys)}")
    lines.append(f"each key compiled exactly once across the ranks: {'yes' if ok else 'NO'}")
    return ok, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32, help="global batch (sequences a step)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--attention", default=None,
                    help="comma list of torch, sdpa_jit, sdpa_jit:<forward> (forward: auto, flash, cudnn, "
                         "efficient: PyTorch's forward kernel under sdpa_jit); default: torch,sdpa_jit on one "
                         "process, sdpa_jit under torchrun")
    ap.add_argument("--profile", action="store_true",
                    help="first time the attention alone at the model's shape, for each variant")
    ap.add_argument("--tiles-sweep", default="",
                    help="with --profile: also time sdpa-jit's backward with these tiles (plan options "
                         "q_tile,kv_tile,warps,stages; ';'-separated, e.g. '64,128,8,2;128,64,8,2')")
    ap.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--tolerance", type=float, default=0.01, help="final losses agree within this fraction")
    ap.add_argument("--compare", help="a one-GPU run's JSON to compare the final loss with")
    ap.add_argument("--out", default=".", help="directory for the PNG and the JSON")
    ap.add_argument("--log-every", type=int, default=50)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 77
    os.makedirs(args.out, exist_ok=True)
    data, source = load_text()

    distributed = "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        import torch.distributed as dist
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        gpus = torch.cuda.device_count()
        backend = args.backend
        if backend == "auto":
            backend = "nccl" if gpus >= int(os.environ.get("LOCAL_WORLD_SIZE", world)) else "gloo"
        device = torch.device("cuda", local % gpus)
        torch.cuda.set_device(device)
        dist.init_process_group(backend)
        if rank == 0:
            why = "each rank has its own GPU" if gpus >= world else f"{world} ranks share {gpus} GPU(s)"
            print(f"DistributedDataParallel: {world} ranks, backend {backend} ({why}); "
                  f"SDPA_JIT_CACHE={os.environ.get('SDPA_JIT_CACHE', '(default)')}", flush=True)
        kinds = (args.attention or "sdpa_jit").split(",")
    else:
        rank, world, device = 0, 1, torch.device("cuda", 0)
        kinds = (args.attention or "torch,sdpa_jit").split(",")
    for kind in kinds:
        if kind != "torch" and kind.split(":")[0] != "sdpa_jit":
            raise SystemExit(f"--attention: {kind!r} is not torch, sdpa_jit or sdpa_jit:<forward>")
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} is not a multiple of the {world} ranks")
    if rank == 0:
        print(f"device {torch.cuda.get_device_name(device)}; torch {torch.__version__}; data {source}, "
              f"{data.numel()} bytes; GPT {args.layers} layers, d_model {args.d_model}, {args.heads} heads of "
              f"{args.d_model // args.heads}, context {args.context}, global batch {args.batch}, {args.steps} steps"
              f"{', torch.compile' if args.compile else ''}", flush=True)

    profile = profile_attention(args, device) if args.profile and rank == 0 else None
    results = [train(kind, args, data, device, rank, world, distributed) for kind in kinds]
    status = 0
    if rank == 0:
        print(f"\n{'attention':<16} {'step ms':>8} {'tokens/s':>11} {'final loss':>11} {'held-out':>9} "
              f"{'first step ms':>14}")
        for r in results:
            print(f"{r['attention']:<16} {r['step_ms']:8.2f} {r['tokens_per_s']:11.0f} {r['final_loss']:11.4f} "
                  f"{r['held_out_loss']:9.4f} {r['first_step_ms']:14.1f}")
    base = next((r for r in results if r["attention"] == "torch"), None)
    if base is not None and rank == 0:
        for r in results:
            if r is base:
                continue
            rel = abs(base["final_loss"] - r["final_loss"]) / base["final_loss"]
            speed = base["step_ms"] / r["step_ms"]
            agree = rel <= args.tolerance
            print(f"{r['attention']} vs torch: final losses differ by {rel * 100:.3f}% "
                  f"({'within' if agree else 'NOT within'} {args.tolerance * 100:g}%); step speed "
                  f"{speed:.3f}x torch's ({'no slower' if speed >= 1.0 else 'slower'})")
            status |= 0 if agree else 1
    if distributed:
        import torch.distributed as dist
        import sdpa_jit.torch as st
        gathered = [None] * world
        dist.all_gather_object(gathered, st.compile_records())
        if rank == 0 and any(kind != "torch" for kind in kinds):
            ok, lines = cache_report(gathered, world)
            print("\n".join(lines))
            status |= 0 if ok else 1
        if rank == 0 and args.compare:
            single = json.load(open(args.compare))
            for r in results:
                ref = next((x for x in single["results"] if x["attention"] == r["attention"]), None)
                if ref is None:
                    continue
                rel = abs(ref["final_loss"] - r["final_loss"]) / ref["final_loss"]
                worst = max(abs(a - b) for a, b in zip(ref["losses"], r["losses"]))
                agree = rel <= args.tolerance
                print(f"{r['attention']}: final loss {r['final_loss']:.4f} (mean over the ranks) vs the one-GPU "
                      f"run's {ref['final_loss']:.4f}: {rel * 100:.3f}% apart ({'within' if agree else 'NOT within'} "
                      f"{args.tolerance * 100:g}%); largest per-step difference {worst:.4f}")
                status |= 0 if agree else 1
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        name = "train_ddp" if distributed else "train_single"
        meta = {"world": world, "args": vars(args), "device": torch.cuda.get_device_name(device),
                "torch": torch.__version__, "results": results, "profile": profile}
        with open(os.path.join(args.out, f"{name}.json"), "w") as f:
            json.dump(meta, f)
        if not distributed:
            png = os.path.join(args.out, "train_gpt_loss.png")
            plot(results, png, f"GPT {args.layers}x{args.d_model}, ctx {args.context}, batch {args.batch}, "
                               f"{args.steps} steps, seed {args.seed}, {torch.cuda.get_device_name(device)}")
            print(f"wrote {png}")
    return status


if __name__ == "__main__":
    sys.exit(main())
