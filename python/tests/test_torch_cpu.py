"""torch CPU tensors on the CPU twin, and the vLLM-shaped communicator (skipped, with the
reason, where torch is not installed; the device run has torch)."""

import pytest

import detcoll
from conftest import close_all, on_ranks
from standins import ArrayInterfaceOnly, DLPackNoDevice, DLPackOnly
from tree import tree

torch = pytest.importorskip("torch", reason="torch is not installed: its tensor paths run where it is (device run)")

from detcoll.vllm_communicator import DetcollCommunicator  # noqa: E402


def bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def data(dtype, rank, shape):
    g = torch.Generator().manual_seed(1000 + rank)
    return (torch.randn(*shape, generator=g) * 100).to(dtype)


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"w{w}")
def group(request):
    comms = detcoll.thread_group(request.param, capacity=8192)
    yield comms
    close_all(comms)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_every_op(group, dtype):
    w = len(group)
    xs = [data(dtype, r, (8 * w, 33)) for r in range(w)]
    want = tree(xs)

    def call(c):
        x = xs[c.rank]
        y = x.clone()
        c.all_reduce(y)
        return y, c.all_gather(x), c.reduce_scatter(x), c.reduce_scatter_many([x, x[: 2 * w]])

    for r, (y, g, s, many) in enumerate(on_ranks(group, call)):
        shard = 8 * w // w
        assert torch.equal(bits(y), bits(want))
        assert torch.equal(bits(g), bits(torch.cat(xs)))
        assert torch.equal(bits(s), bits(want[r * shard:(r + 1) * shard]))
        assert torch.equal(bits(many[0]), bits(s))
        assert torch.equal(bits(many[1]), bits(tree([x[: 2 * w] for x in xs])[2 * r:2 * r + 2]))


def test_torch_errors_write_nothing(group):
    x = torch.ones(16, 4)
    out = torch.full((16, 4), -7.25)
    with pytest.raises(detcoll.NotContiguous):
        group[0].all_reduce(x.t(), out=out)
    with pytest.raises(detcoll.DtypeMismatch):
        group[0].all_reduce(x, out=out.to(torch.bfloat16))
    with pytest.raises(detcoll.UnsupportedDtype):
        group[0].all_reduce(torch.ones(4, dtype=torch.complex64))
    assert bool((out == -7.25).all())
    if torch.cuda.is_available():
        with pytest.raises(detcoll.WrongDevice):
            group[0].all_reduce(torch.ones(4, device="cuda"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("kind", [DLPackOnly, DLPackNoDevice, ArrayInterfaceOnly], ids=lambda k: k.__name__)
def test_interface_only_objects_over_torch_tensors(group, kind, dtype):
    """torch CPU tensors handed over through DLPack alone or the array interface alone (bf16
    as "<V2"): the same bits as the plain tensors, every op."""
    w = len(group)
    xs = [data(dtype, r, (8 * w, 33)) for r in range(w)]

    def call(c, wrap):
        x = xs[c.rank]
        y, ar = x.clone(), torch.empty_like(x)
        c.all_reduce(wrap(y))
        c.all_reduce(wrap(x), out=wrap(ar))
        ag, rs = x.new_empty(w * 8 * w, 33), x.new_empty(8, 33)
        c.all_gather(wrap(x), out=wrap(ag))
        c.reduce_scatter(wrap(x), out=wrap(rs))
        many = [x.new_empty(8, 33), x.new_empty(2, 33)]
        c.reduce_scatter_many([wrap(x), wrap(x[: 2 * w])], outs=[wrap(m) for m in many])
        return [y, ar, ag, rs] + many

    for plain, through in zip(on_ranks(group, call, lambda t: t), on_ranks(group, call, kind)):
        for p, t in zip(plain, through):
            assert torch.equal(bits(p), bits(t))


def vllm_shaped(comm):
    c = DetcollCommunicator.__new__(DetcollCommunicator)  # over an existing rank (threads here)
    c.comm, c.world_size, c.rank_in_group = comm, comm.world_size, comm.rank
    return c


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_vllm_communicator_shapes(group, dim):
    w = len(group)
    xs = [data(torch.bfloat16, r, (4 * w, 2 * w, 3 * w)) for r in range(w)]  # every dim divisible by w
    want = tree(xs)

    def call(c):
        v = vllm_shaped(c)
        return v.all_reduce(xs[c.rank]), v.all_gather(xs[c.rank], dim), v.reduce_scatter(xs[c.rank], dim)

    for r, (ar, ag, rs) in enumerate(on_ranks(group, call)):
        assert torch.equal(bits(ar), bits(want))
        assert torch.equal(bits(ag), bits(torch.cat(xs, dim=dim)))
        assert torch.equal(bits(rs), bits(want.chunk(w, dim=dim)[r]))


def test_vllm_reduce_scatter_of_an_indivisible_dim_is_a_typed_error(group):
    w = len(group)
    if w == 1:
        pytest.skip("every dim divides a world of 1")

    def call(c):
        with pytest.raises(detcoll.NotDivisible, match="not divisible"):
            vllm_shaped(c).reduce_scatter(torch.ones(2 * w, w + 1, dtype=torch.bfloat16), dim=1)
        return True

    assert all(on_ranks(group, call))
