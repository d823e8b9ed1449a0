"""The torch glue, run in CI without torch: a numpy-backed stand-in for the few torch APIs the
package touches (tensor attributes, ``torch.distributed`` group queries and
``all_gather_object``, ``torch.cuda.is_available``), so the tensor read and the bootstrap
through a torch group run here; the real torch runs them in test_torch_cpu.py and the device
checks. Ranks are threads; the stand-in group exchanges objects through a barrier."""

import sys
import threading
import types

import numpy as np
import pytest

import detcoll
from detcoll import _tensor
from conftest import close_all, on_ranks
from reference import assert_bits_equal, contribution, tree


class Dtype:
    def __init__(self, name, np_dtype):
        self.name, self.np = name, np.dtype(np_dtype)

    def __repr__(self):
        return f"torch.{self.name}"


class Device:
    type, index = "cpu", None


class Tensor:
    """What the package reads from a torch tensor, over a numpy array."""

    def __init__(self, a, dtype):
        self.a, self.dtype = a, dtype
        self.is_cuda, self.device = False, Device()

    @property
    def shape(self):
        return self.a.shape

    def is_contiguous(self):
        return self.a.flags.c_contiguous

    def data_ptr(self):
        return self.a.ctypes.data

    def numel(self):
        return self.a.size

    def new_empty(self, shape):
        return Tensor(np.empty(shape, self.a.dtype), self.dtype)

    def contiguous(self):
        return self


class Group:
    """torch.distributed's group calls over threads: rank from a thread-local."""

    def __init__(self, world):
        self.world, self.slots, self.barrier, self.local = world, [None] * world, threading.Barrier(world), threading.local()

    def all_gather_object(self, out, obj, group=None):
        assert group is self
        self.slots[self.local.rank] = obj
        self.barrier.wait(30)
        out[:] = list(self.slots)
        self.barrier.wait(30)


def fake_torch(group):
    torch = types.ModuleType("torch")
    torch.float32, torch.float16 = Dtype("float32", np.float32), Dtype("float16", np.float16)
    torch.complex64 = Dtype("complex64", np.complex64)
    torch.Tensor = Tensor
    torch.cuda = types.SimpleNamespace(is_available=lambda: False)
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True
    dist.is_initialized = lambda: True
    dist.group = types.SimpleNamespace(WORLD=group)
    dist.get_rank = lambda g: g.local.rank
    dist.get_world_size = lambda g: g.world
    dist.all_gather_object = group.all_gather_object
    torch.distributed = dist
    return torch


@pytest.fixture
def torch_world(monkeypatch):
    def make(world):
        group = Group(world)
        torch = fake_torch(group)
        monkeypatch.setitem(sys.modules, "torch", torch)
        monkeypatch.setitem(sys.modules, "torch.distributed", torch.distributed)
        monkeypatch.setattr(_tensor, "_TORCH_DTYPES", {})
        monkeypatch.setattr(_tensor, "_READERS", {})
        for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(v, raising=False)
        return group, torch

    return make


@pytest.mark.parametrize("world", [1, 2, 4])
def test_default_group_bootstrap_and_tensors(torch_world, world):
    group, torch = torch_world(world)
    comms = [None] * world

    def build(r):
        group.local.rank = r
        # group=None: the initialised default group; device=None without CUDA: the CPU twin.
        comms[r] = detcoll.create_deterministic_collective(capacity=4096)

    threads = [threading.Thread(target=build, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(c is not None and c.platform == "cpu" for c in comms)
    assert [c.rank for c in comms] == list(range(world))
    xs = [contribution("f16", r, 8 * 64).reshape(8 * 4, 16) for r in range(world)]

    def call(c):
        x = Tensor(xs[c.rank].copy(), torch.float16)
        c.all_reduce(x)
        return x.a, c.all_gather(Tensor(xs[c.rank], torch.float16)).a, c.reduce_scatter(Tensor(xs[c.rank], torch.float16)).a

    full = tree(xs)
    for r, (ar, ag, rs) in enumerate(on_ranks(comms, call)):
        assert_bits_equal(ar, full, f"rank {r} all_reduce")
        assert_bits_equal(ag, np.concatenate(xs), f"rank {r} all_gather")
        s = 8 * 4 // world
        assert_bits_equal(rs, full[r * s:(r + 1) * s], f"rank {r} reduce_scatter")
    close_all(comms)


def test_tensor_read_errors(torch_world):
    group, torch = torch_world(1)
    group.local.rank = 0
    c = detcoll.create_deterministic_collective(device="cpu", capacity=4096)
    with pytest.raises(detcoll.UnsupportedDtype, match="complex64"):
        c.all_reduce(Tensor(np.ones(4, np.complex64), torch.complex64))
    with pytest.raises(detcoll.NotContiguous):
        c.all_reduce(Tensor(np.ones((4, 4), np.float32).T, torch.float32))
    out = Tensor(np.full(4, -7.25, np.float16), torch.float16)
    with pytest.raises(detcoll.DtypeMismatch):
        c.all_reduce(Tensor(np.ones(4, np.float32), torch.float32), out=out)
    assert (out.a == -7.25).all()
    c.close()


def test_a_group_without_this_rank_is_refused(torch_world):
    group, _ = torch_world(2)
    group.local.rank = -1  # torch.distributed.get_rank(group) of a non-member
    with pytest.raises(detcoll.InvalidConfig, match="not a member"):
        detcoll.create_deterministic_collective(group=group, device="cpu")


def test_install_into_vllm_routes_tp_groups_only(torch_world, monkeypatch):
    group, torch = torch_world(1)
    group.local.rank = 0

    class CudaCommunicator:  # vLLM's constructor signature and the attributes its base sets
        def __init__(self, cpu_group, device=None, device_group=None, unique_name=""):
            self.cpu_group, self.device, self.unique_name = cpu_group, device, unique_name

        def all_reduce(self, input_):
            return "vllm's own"

        def all_gather(self, input_, dim=-1):
            return "vllm's own"

        def reduce_scatter(self, input_, dim=-1):
            return "vllm's own"

    names = ["vllm", "vllm.distributed", "vllm.distributed.device_communicators"]
    for n in names:
        monkeypatch.setitem(sys.modules, n, types.ModuleType(n))
    cc = types.ModuleType("vllm.distributed.device_communicators.cuda_communicator")
    cc.CudaCommunicator = CudaCommunicator
    monkeypatch.setitem(sys.modules, cc.__name__, cc)
    monkeypatch.setattr(sys.modules["vllm.distributed.device_communicators"], "cuda_communicator", cc, raising=False)

    from detcoll.vllm_communicator import install_into_vllm

    install_into_vllm(capacity=4096)
    tp = CudaCommunicator(group, device="cpu", unique_name="tp:0")
    pp = CudaCommunicator(group, device="cpu", unique_name="pp:0")
    x = Tensor(contribution("f16", 0, 64), torch.float16)
    y = tp.all_reduce(x)
    assert isinstance(y, Tensor) and y is not x
    assert_bits_equal(y.a, x.a)  # world 1: the tree of one rank
    assert pp.all_reduce(x) == "vllm's own"
    # Keyword arguments reach both (vLLM's methods take `dim=`): they raised TypeError.
    assert pp.all_gather(x, dim=0) == "vllm's own"
    assert pp.reduce_scatter(x, dim=0) == "vllm's own"
    # A second install with other settings says it is ignored.
    with pytest.warns(RuntimeWarning, match="already installed"):
        install_into_vllm(capacity=8192)
    # vLLM's destroy() closes the detcoll collective too (it stayed open until collected).
    d = tp._detcoll
    tp.destroy()
    assert tp._detcoll is None
    with pytest.raises(detcoll.Closed):
        d.comm.check()
    pp.destroy()
