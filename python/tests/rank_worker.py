"""One rank process of test_processes.py: ``python rank_worker.py MODE OUT_DIR``, started by
``detcoll.launch`` with torchrun's variables. Writes ``rank<r>.npz`` (results) or
``rank<r>.txt`` (the exception class a call raised)."""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import detcoll  # noqa: E402
from reference import REDUCE_DTYPES, BF16, contribution  # noqa: E402

N = 8 * 1000 + 8  # above the 16 KiB capacity for f32: chunked


def ops(comm, tensor=lambda a: a, array=np.asarray):
    """Every op on every reduction dtype this host has; results as arrays by name (`tensor`
    makes the library's input from an array, `array` an array from its result)."""
    r, w = comm.rank, comm.world_size
    res = {}
    for dt in REDUCE_DTYPES:
        if dt == "bf16" and BF16 is None:
            continue
        x = contribution(dt, r, N)
        res[f"all_reduce_{dt}"] = array(comm.all_reduce(tensor(x.copy())))
        res[f"all_gather_{dt}"] = array(comm.all_gather(tensor(x)))
        res[f"reduce_scatter_{dt}"] = array(comm.reduce_scatter(tensor(x)))
        lanes = comm.reduce_scatter_many([tensor(x), tensor(contribution(dt, r, 16 * w, seed=5))])
        for i, lane in enumerate(lanes):
            res[f"many{i}_{dt}"] = array(lane)
    comm.synchronize()
    res["route"] = np.array(comm.route("all_reduce", N * 4))
    return res


def bits_of(res):
    """npz cannot hold bf16 (ml_dtypes): store bit patterns."""
    return {k: (v.view(np.uint16) if v.dtype == BF16 else v) for k, v in res.items()}


def main():
    mode, out_dir = sys.argv[1], sys.argv[2]
    rank = int(os.environ["RANK"])
    if mode == "ops":
        comm = detcoll.create_deterministic_collective(device="cpu", capacity=16 << 10)
        np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **bits_of(ops(comm)))
        comm.close()
    elif mode == "mismatch":
        # Ranks make different calls: every rank must get a typed error, none may hang.
        comm = detcoll.create_deterministic_collective(device="cpu", capacity=16 << 10)
        try:
            comm.all_reduce(np.ones(64 * (rank + 1), np.float32))
            comm.synchronize()
            name = "no error"
        except detcoll.DetcollError as e:
            name = type(e).__name__
        with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
            f.write(name)
    elif mode == "torch_group":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        comm = detcoll.create_deterministic_collective(capacity=16 << 10, device="cpu")
        # numpy has no bf16: torch bf16 results leave as their bits (int16 view).
        res = ops(comm, tensor=lambda a: torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
                  if a.dtype == BF16 else torch.from_numpy(a),
                  array=lambda t: t.view(torch.int16).numpy().view(BF16)
                  if t.dtype == torch.bfloat16 else t.numpy())
        res = {k: (v.view(np.uint16) if v.dtype.kind == "V" else v) for k, v in res.items()}
        np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **bits_of(res))
        comm.close()
        dist.destroy_process_group()
    elif mode == "peer_exits":
        # Rank 1 leaves without closing (a crash); rank 0 then closes: it must not wait the
        # close bound for an acknowledgement that cannot come (PeerDied, at once).
        import time

        comm = detcoll.create_deterministic_collective(device="cpu", capacity=16 << 10)
        comm.all_reduce(np.ones(64, np.float32))
        comm.synchronize()
        if rank == 1:
            os._exit(0)
        time.sleep(0.5)  # rank 1 is gone by now
        t = time.monotonic()
        try:
            comm.close()
            name = "no error"
        except detcoll.DetcollError as e:
            name = type(e).__name__
        with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
            f.write(f"{name} {time.monotonic() - t:.3f}")
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
