"""A tensor-parallel MLP in torch whose output bits are the same at TP = 1, 2, 4 and 8.

    python python/examples/tp_mlp.py --tp 1 2 4 8            # one process per TP rank, per size
    torchrun --nproc-per-node 4 python/examples/tp_mlp.py --worker --out-dir out   # one size

The layer is the sequence-parallel MLP ``all_gather(x) -> SiLU(x W1) W2 -> reduce_scatter``.
What makes it TP-invariant (as crates/layers does in Rust):

1. The FFN width is cut into 8 fixed leaves (the largest TP size). A rank of a TP=k group owns
   leaves ``r*8/k .. (r+1)*8/k`` and computes each leaf's product ``SiLU(x W1[:, leaf]) W2[leaf]``
   as its own GEMM, of the same shape at every TP, so each leaf's bits do not depend on TP.
2. The rank folds its leaves with the balanced tree, and detcoll's reduce_scatter evaluates the
   balanced tree over the ranks: together exactly the TP=8 tree
   ``((P0+P1)+(P2+P3))+((P4+P5)+(P6+P7))``, every add in the tensor's dtype.

For comparison each size also runs the usual layer ("naive": one GEMM over the rank's whole
``F/k`` shard) reduced by detcoll and, where every rank has a GPU of its own, by NCCL's
``reduce_scatter_tensor``; their bits change with TP. Several ranks on one GPU need MPS
(``nvidia-cuda-mps-control -d``); ``--device cpu`` runs everything on the CPU twin.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from detcoll.reference import tree  # the canonical tree, every add in the dtype

LEAVES = 8


def model(args, device):
    """Input and weights, the same on every rank and at every TP (seeded, made on the CPU)."""
    g = torch.Generator().manual_seed(args.seed)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]

    def rand(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).to(dt).to(device)

    x = rand(args.tokens, args.hidden, scale=1.0)
    w1 = rand(args.hidden, args.ffn, scale=args.hidden ** -0.5)
    w2 = rand(args.ffn, args.hidden, scale=args.ffn ** -0.5)
    return x, w1, w2


def forward_invariant(comm, x_local, w1, w2, tp, rank):
    x = comm.all_gather(x_local)  # all tokens, rank order = token order
    width = w1.shape[1] // LEAVES
    leaves = range(rank * LEAVES // tp, (rank + 1) * LEAVES // tp)
    parts = [
        F.silu(x @ w1[:, l * width:(l + 1) * width].contiguous()) @ w2[l * width:(l + 1) * width].contiguous()
        for l in leaves
    ]
    return comm.reduce_scatter(tree(parts))


def forward_naive(comm, x_local, w1, w2, tp, rank, reduce_scatter):
    x = comm.all_gather(x_local)
    cols = w1.shape[1] // tp
    partial = F.silu(x @ w1[:, rank * cols:(rank + 1) * cols].contiguous()) @ w2[rank * cols:(rank + 1) * cols].contiguous()
    return reduce_scatter(partial)


def worker(args):
    import detcoll

    dist.init_process_group("gloo")  # the bootstrap group (and the CPU path's)
    rank, tp = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.matmul.allow_tf32 = False
    else:
        device = torch.device("cpu")
    comm = detcoll.create_deterministic_collective(device=device)
    x, w1, w2 = model(args, device)
    rows = args.tokens // tp
    x_local = x[rank * rows:(rank + 1) * rows].contiguous()

    outs = {
        "invariant": forward_invariant(comm, x_local, w1, w2, tp, rank),
        "naive_detcoll": forward_naive(comm, x_local, w1, w2, tp, rank, comm.reduce_scatter),
    }
    # NCCL refuses two ranks on one GPU: only where every rank has a GPU of its own.
    if args.device == "cuda" and torch.cuda.device_count() >= tp:
        nccl = dist.new_group(backend="nccl")

        def nccl_rs(partial):
            out = partial.new_empty((partial.shape[0] // tp,) + tuple(partial.shape[1:]))
            dist.reduce_scatter_tensor(out, partial, group=nccl)
            return out

        outs["naive_nccl"] = forward_naive(comm, x_local, w1, w2, tp, rank, nccl_rs)
    full = {k: comm.all_gather(v) for k, v in outs.items()}
    comm.synchronize()
    if rank == 0:
        os.makedirs(args.out_dir, exist_ok=True)
        torch.save({k: v.cpu() for k, v in full.items()}, os.path.join(args.out_dir, f"tp{tp}.pt"))
    comm.close()
    dist.destroy_process_group()


def differing(a, b):
    ints = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return int((a.view(ints) != b.view(ints)).sum())


def driver(args):
    from detcoll.launch import launch

    me = [sys.executable, os.path.abspath(__file__), "--worker"] + [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("tp", "worker", "timeout")
    ]
    results = {}
    for tp in args.tp:
        done = launch(tp, me, timeout=args.timeout)
        if any(p.returncode for p in done):
            print(f"TP {tp}: a rank failed ({[p.returncode for p in done]})")
            return 1
        results[tp] = torch.load(os.path.join(args.out_dir, f"tp{tp}.pt"))
    base = results[args.tp[0]]
    ok = True
    for tp, res in results.items():
        line = [f"TP {tp}:"]
        for k in ("invariant", "naive_detcoll", "naive_nccl"):
            if k not in res:
                line.append(f"{k} n/a (NCCL needs a GPU per rank)")
            elif k not in base:
                line.append(f"{k} (no TP {args.tp[0]} {k} to compare)")
            else:
                d = differing(res[k], base[k])
                line.append(f"{k} differs from TP {args.tp[0]} in {d} of {res[k].numel()} elements")
                ok &= k != "invariant" or d == 0
        print("  ".join(line))
    sizes = ", ".join(str(t) for t in args.tp)
    print(f"detcoll: {'bit-identical' if ok else 'NOT bit-identical'} at TP {sizes}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4, 8], help="TP sizes to run and compare")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--ffn", type=int, default=2048, help="a multiple of 8 (the leaves)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--out-dir", default="tp_mlp_out")
    ap.add_argument("--worker", action="store_true", help="run one rank (under torchrun or detcoll.launch)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per TP size before its ranks are stopped")
    args = ap.parse_args()
    if args.ffn % LEAVES or args.tokens % max(args.tp):
        ap.error("--ffn must be a multiple of 8 and --tokens of the largest TP size")
    if args.worker:
        worker(args)
        return 0
    return driver(args)


if __name__ == "__main__":
    sys.exit(main())
