"""Constructors: ``create_deterministic_collective`` (the seeds' entry point) and
``thread_group`` (ranks as threads of this process)."""

import os
import socket
import sys
from typing import List, Optional, Tuple

from . import _detcoll, _nvrtc
from .collective import Collective

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _device(device) -> Tuple[str, Optional[int]]:
    """``("cpu", None)`` or ``("cuda", ordinal)`` from ``device`` (None, "cpu", "cuda",
    "cuda:N", an int, a ``torch.device``)."""
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return "cuda", torch.cuda.current_device()
        return "cpu", None
    if isinstance(device, int):
        return "cuda", device
    kind, index = getattr(device, "type", None), getattr(device, "index", None)
    if kind is None:
        kind, _, idx = str(device).partition(":")
        if idx and not idx.isdigit():
            raise _detcoll.InvalidConfig(f"device {device!r}: expected 'cpu', 'cuda', 'cuda:N' or an ordinal")
        index = int(idx) if idx else None
    if kind == "cpu":
        return "cpu", None
    if kind == "cuda":
        if index is None:
            torch = sys.modules.get("torch")
            index = torch.cuda.current_device() if torch is not None and torch.cuda.is_available() else None
        return "cuda", index
    raise _detcoll.InvalidConfig(f"device {device!r}: expected 'cpu', 'cuda', 'cuda:N' or an ordinal")


def _torch_group(group):
    """The torch.distributed group to bootstrap through: ``group`` when given, else the
    default group when torch.distributed is initialised, else None."""
    if group is not None:
        return group
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    return None


def _group_gather(group):
    """``(rank, world, gather)`` for a torch group: ``gather(bytes) -> list[bytes]`` is
    ``all_gather_object`` on it (gloo, or NCCL on the current device)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise _detcoll.InvalidConfig("this process is not a member of the group it passed")

    def gather(mine: bytes):
        out = [None] * world
        dist.all_gather_object(out, bytes(mine), group=group)
        return out

    return rank, world, gather


def _local_layout(rank: int, gather) -> Tuple[int, int]:
    """This rank's index among the group's ranks on its host, and their number."""
    hosts = [h.decode() for h in gather(socket.gethostname().encode())]
    mine = hosts[rank]
    return sum(1 for h in hosts[:rank] if h == mine), sum(1 for h in hosts if h == mine)


def create_deterministic_collective(group=None, capacity: Optional[int] = None, device=None) -> Collective:
    """This rank's deterministic collective. Collective: every rank of the group calls it.

    * ``group``: a ``torch.distributed`` process group (TP/DP groups are torch groups); None:
      the default group when torch.distributed is initialised. The collective's handles travel
      through it (``all_gather_object``), so no second rendezvous. Without torch.distributed:
      torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
      ``MASTER_ADDR``, ``MASTER_PORT``, ``DETCOLL_JOB_TOKEN``) through the Rust TCP rendezvous;
      with none of it set, a world of one.
    * ``capacity``: staging bytes per rank (default 16 MiB); larger calls run in chunks.
    * ``device``: ``"cpu"`` (the CPU twin: numpy arrays and CPU tensors), ``"cuda"`` /
      ``"cuda:N"`` / an ordinal; None: torch's current CUDA device when CUDA is available,
      else the CPU.
    """
    kind, index = _device(device)
    platform = "cuda" if kind == "cuda" else "cpu"
    if platform == "cuda":
        _nvrtc.ensure()
    tg = _torch_group(group)
    if tg is not None:
        rank, world, gather = _group_gather(tg)
        local_rank, local_world = _local_layout(rank, gather)
        raw = _detcoll.from_group(rank, world, local_rank, local_world, gather, capacity, platform, index)
    elif any(v in os.environ for v in _TORCHRUN_VARS):
        raw = _detcoll.from_env(capacity, platform, index)
    else:
        raw = _detcoll.from_group(0, 1, 0, 1, lambda mine: [bytes(mine)], capacity, platform, index)
    return Collective(raw, index)


def thread_group(world: int, capacity: Optional[int] = None, device: str = "cpu") -> List[Collective]:
    """``world`` ranks as threads of this process (``device="cpu"``: the CPU twin; ``"cuda"``:
    rank ``r`` on GPU ``r % count``). Drive each communicator from its own thread: a call
    returns when every rank has made it (the GIL is released meanwhile)."""
    kind, _ = _device(device)
    if kind == "cuda":
        _nvrtc.ensure()
    raws = _detcoll.thread_group(world, capacity, "cuda" if kind == "cuda" else "cpu")
    return [Collective(r, None) for r in raws]
