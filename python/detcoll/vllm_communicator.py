"""A drop-in for vLLM's device communicator: the method shapes of
``vllm.distributed.device_communicators.base_device_communicator.DeviceCommunicatorBase``
(``all_reduce(input_)``, ``all_gather(input_, dim)``, ``reduce_scatter(input_, dim)``) over
detcoll, so tensor-parallel reductions have the same bits at every TP size, batch and run.

Standalone::

    comm = DetcollCommunicator(cpu_group=tp_cpu_group, device=torch.device("cuda", local_rank))
    y = comm.all_reduce(x)                 # a new tensor, like vLLM's

Into vLLM (tested against the method shapes, not against a vLLM install: see python/README.md)::

    from detcoll.vllm_communicator import install_into_vllm
    install_into_vllm()                    # before the engine builds its communicators

Only these three calls change; vLLM's other collectives stay its own. In particular
``all_gatherv`` and ``reduce_scatterv`` (the variable-size forms) are not routed through detcoll:
``install_into_vllm`` leaves them, and every other method, to vLLM's communicator, and
``DetcollCommunicator`` does not have them.

``DetcollCommunicator`` also has the attributes users of vLLM's ``DeviceCommunicatorBase`` read:
``rank`` and ``rank_in_group`` (this rank in the group), ``world_size``, ``ranks`` (the global
ranks of the group), ``global_rank`` and ``global_world_size``.
"""

import warnings
from typing import Optional

from .factory import create_deterministic_collective


class DetcollCommunicator:
    """vLLM's device-communicator calls on a detcoll collective built over ``cpu_group`` (a
    gloo group of the TP ranks: the bootstrap)."""

    def __init__(self, cpu_group=None, device=None, device_group=None, unique_name: str = "",
                 capacity: Optional[int] = None):
        self.cpu_group, self.device, self.device_group, self.unique_name = cpu_group, device, device_group, unique_name
        self.comm = create_deterministic_collective(group=cpu_group, capacity=capacity, device=device)
        self.world_size, self.rank_in_group = self.comm.world_size, self.comm.rank
        self.rank = self.rank_in_group
        self.ranks, self.global_rank, self.global_world_size = _global_ranks(cpu_group, self.rank, self.world_size)

    def all_reduce(self, input_):
        out = input_.new_empty(input_.shape)
        return self.comm.all_reduce(input_.contiguous(), out=out)

    def all_gather(self, input_, dim: int = -1):
        """Every rank's ``input_`` concatenated along ``dim`` (vLLM's layout: gather along a
        new leading dim, then move it to ``dim``)."""
        if dim < 0:
            dim += input_.dim()
        size = tuple(input_.shape)
        out = input_.new_empty((self.world_size,) + size)
        self.comm.all_gather(input_.contiguous(), out=out)
        out = out.movedim(0, dim)
        return out.reshape(size[:dim] + (self.world_size * size[dim],) + size[dim + 1:])

    def reduce_scatter(self, input_, dim: int = -1):
        """This rank's shard along ``dim`` of the fixed tree over every rank's ``input_``."""
        if dim < 0:
            dim += input_.dim()
        if input_.shape[dim] % self.world_size != 0:
            from . import NotDivisible

            raise NotDivisible(
                f"reduce_scatter: dim {dim} has {input_.shape[dim]} entries, not divisible by the "
                f"world size {self.world_size}"
            )
        moved = input_.movedim(dim, 0).contiguous()
        out = moved.new_empty((moved.shape[0] // self.world_size,) + tuple(moved.shape[1:]))
        self.comm.reduce_scatter(moved, out=out)
        return out.movedim(0, dim).contiguous()

    def destroy(self):
        self.comm.close()


def _global_ranks(group, rank: int, world_size: int):
    """``(ranks, global_rank, global_world_size)`` as vLLM's ``DeviceCommunicatorBase`` sets them:
    the group's global ranks and this process's global rank and world from torch.distributed
    when it is initialised; otherwise (a group of its own) ``range(world_size)``, ``rank`` and
    ``world_size``."""
    import sys

    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            g = group if group is not None else dist.group.WORLD
            return list(dist.get_process_group_ranks(g)), dist.get_rank(), dist.get_world_size()
    except Exception:  # a stand-in group torch.distributed does not know: ranks of its own
        pass
    return list(range(world_size)), rank, world_size


def install_into_vllm(capacity: Optional[int] = None, groups=("tp",)):
    """Routes the ``all_reduce``/``all_gather``/``reduce_scatter`` of vLLM's CUDA communicators
    whose ``unique_name`` contains one of ``groups`` (default: the tensor-parallel groups, whose
    reductions decide the bits) through detcoll: wraps ``CudaCommunicator.__init__`` to build a
    ``DetcollCommunicator`` on the communicator's ``cpu_group`` and device. Other groups keep
    vLLM's own calls. Call it in every worker process before vLLM builds its groups (e.g. from a
    plugin's entry point); every rank of a group then takes the same decision."""
    from vllm.distributed.device_communicators import cuda_communicator as cc

    cls = cc.CudaCommunicator
    settings = (capacity, tuple(groups))
    installed = getattr(cls, "_detcoll_installed", None)
    if installed is not None:
        if installed != settings:
            warnings.warn(
                f"detcoll is already installed into vLLM with capacity={installed[0]}, groups={installed[1]}; "
                f"this call's capacity={capacity}, groups={tuple(groups)} is ignored",
                RuntimeWarning, stacklevel=2,
            )
        return
    init, destroy = cls.__init__, getattr(cls, "destroy", None)
    originals = {m: getattr(cls, m) for m in ("all_reduce", "all_gather", "reduce_scatter")}

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        name = getattr(self, "unique_name", "") or ""
        self._detcoll = (DetcollCommunicator(cpu_group=self.cpu_group, device=self.device, capacity=capacity)
                         if any(g in name for g in groups) else None)

    def route(method):
        # Keyword arguments too (``all_gather(x, dim=0)``), as vLLM's own methods take them.
        def call(self, input_, *args, **kwargs):
            d = getattr(self, "_detcoll", None)
            if d is not None:
                return getattr(d, method)(input_, *args, **kwargs)
            return originals[method](self, input_, *args, **kwargs)

        call.__name__ = method
        return call

    def destroy_both(self, *args, **kwargs):
        # vLLM's destroy() releases its communicator: the detcoll collective goes with it.
        d = getattr(self, "_detcoll", None)
        if d is not None:
            self._detcoll = None
            d.destroy()
        if destroy is not None:
            return destroy(self, *args, **kwargs)

    cls.__init__ = __init__
    for m in originals:
        setattr(cls, m, route(m))
    cls.destroy = destroy_both
    cls._detcoll_installed = settings
