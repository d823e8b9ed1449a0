"""Tensors whose memory is not what their values say, and writes autograd must see.

* torch's lazy negation/conjugation views (``is_neg()``/``is_conj()``): their memory holds the
  un-negated values, so they are refused (never read or written as raw storage).
* Tensors without memory (FakeTensor, storage-less wrapper subclasses, an array interface at
  address 0), vmap's batched tensors, sparse and nested tensors: typed errors, never a crash.
* Writes into torch tensors: refused where torch's own in-place ops refuse (a leaf that requires
  grad, a view of one, an inference tensor outside inference mode); otherwise the version
  counter is bumped, so a backward through a tensor saved before the write raises torch's own
  "modified by an inplace operation" instead of using the overwritten values.
* reduce_scatter's NCCL in-place shard form checks ``out``'s dtype; reduce_scatter_many takes
  that form per lane; ``route`` and a 0-d reduce_scatter give typed, accurate errors; the vLLM
  communicator's attributes.

The numpy parts run without torch; the torch parts skip where torch is not installed."""

import numpy as np
import pytest

import detcoll
from conftest import close_all, on_ranks
from tree import tree


def need_torch():
    return pytest.importorskip("torch", reason="torch is not installed: its tensor paths run where it is")


def tbits(t):
    torch = need_torch()
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@pytest.fixture(scope="module", params=[2, 3], ids=lambda w: f"w{w}")
def group(request):
    comms = detcoll.thread_group(request.param, capacity=8192)
    yield comms
    close_all(comms)


def each_rank(group, fn):
    """``fn(comm)`` on every rank: the results, exceptions included, in rank order."""

    def call(c):
        try:
            return fn(c)
        except detcoll.DetcollError as e:
            return e

    return on_ranks(group, call)


# -- 1. lazy negation / conjugation views --------------------------------------------------------
def neg_views():
    torch = need_torch()
    one = torch.tensor([1 + 1j], dtype=torch.complex64).conj().imag  # public: -1.0, is_neg()
    assert one.is_neg() and one.is_contiguous()
    made = torch._neg_view(torch.arange(1.0, 13.0).reshape(6, 2))  # values -1 .. -12
    assert made.is_neg() and made.is_contiguous()
    return one, made


def test_neg_view_inputs_are_refused(group):
    torch = need_torch()
    c, w = group[0], len(group)
    for x in neg_views():
        out = torch.full(x.shape, -7.25)
        with pytest.raises(detcoll.InvalidArgument, match=r"x: .*resolve_neg\(\)"):
            c.all_reduce(x, out=out)
        with pytest.raises(detcoll.InvalidArgument, match=r"x: .*resolve_neg\(\)"):
            c.all_gather(x, out=torch.full((w * x.shape[0],) + tuple(x.shape[1:]), -7.25))
        with pytest.raises(detcoll.InvalidArgument, match=r"xs\[0\]: .*resolve_neg\(\)"):
            c.reduce_scatter_many([x])
        assert bool((out == -7.25).all())
    one, made = neg_views()
    with pytest.raises(detcoll.InvalidArgument, match=r"x: .*resolve_neg\(\)"):
        c.reduce_scatter(torch._neg_view(torch.ones(2 * w)))
    # resolved, the same values reduce as themselves on every rank
    got = each_rank(group, lambda c: c.all_reduce(made.resolve_neg(), out=torch.empty(6, 2)))
    want = tree([-torch.arange(1.0, 13.0).reshape(6, 2)] * w)
    for g in got:
        assert torch.equal(tbits(g), tbits(want))


def test_neg_view_outputs_are_refused_and_untouched(group):
    torch = need_torch()
    c, w = group[0], len(group)
    out = torch._neg_view(torch.full((4,), 7.25))
    with pytest.raises(detcoll.InvalidArgument, match=r"out: .*resolve_neg\(\)"):
        c.all_reduce(torch.ones(4), out=out)
    with pytest.raises(detcoll.InvalidArgument, match=r"out: .*resolve_neg\(\)"):
        c.all_gather(torch.ones(1), out=torch._neg_view(torch.full((w,), 7.25)))
    with pytest.raises(detcoll.InvalidArgument, match=r"outs\[0\]: .*resolve_neg\(\)"):
        c.reduce_scatter_many([torch.ones(w)], outs=[torch._neg_view(torch.full((1,), 7.25))])
    residual = torch._neg_view(torch.full((1, 4), 7.25))
    with pytest.raises(detcoll.InvalidArgument, match=r"residual: .*resolve_neg\(\)"):
        c.all_reduce_residual_rmsnorm(torch.zeros(1, 4), residual, torch.ones(4))
    with pytest.raises(detcoll.InvalidArgument, match=r"x: .*resolve_neg\(\)"):
        c.all_reduce(out)  # in place
    assert bool((out == -7.25).all()) and bool((residual == -7.25).all())


def test_conj_views_are_refused():
    torch = need_torch()
    c = detcoll.create_deterministic_collective(device="cpu")
    z = torch.tensor([1 + 2j], dtype=torch.complex64).conj()
    assert z.is_conj()
    with pytest.raises(detcoll.InvalidArgument):  # complex has no detcoll dtype either way
        c.all_reduce(z, out=torch.zeros(1, dtype=torch.complex64))
    c.close()


# -- 2. autograd ---------------------------------------------------------------------------------
def test_in_place_write_makes_backward_raise_like_torch(group):
    torch = need_torch()

    def f(c):
        a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        b = a * 1.0  # not a leaf
        y = (b * b).sum()  # saves b
        v0 = b._version
        c.all_reduce(b)
        assert b._version > v0
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.backward()
        assert a.grad is None
        return b.detach()

    for b in on_ranks(group, f):
        assert torch.equal(tbits(b), tbits(tree([torch.tensor([1.0, 2.0, 3.0])] * len(group))))


def test_every_write_bumps_the_version(group):
    torch = need_torch()
    w = len(group)

    def f(c):
        x = torch.arange(float(2 * w * 4)).reshape(2 * w, 4)
        seen = []

        def bumped(t, call):
            v = t._version
            call()
            seen.append(t._version > v)

        out = torch.empty(2 * w, 4)
        bumped(out, lambda: c.all_reduce(x, out=out))
        y = x.clone()
        bumped(y, lambda: c.all_reduce(y))
        g = torch.empty(2 * w * w, 4)
        bumped(g, lambda: c.all_gather(x, out=g))
        g2 = torch.empty(2 * w * w, 4)
        g2.chunk(w)[c.rank].copy_(x)
        bumped(g2, lambda: c.all_gather(g2.chunk(w)[c.rank], out=g2))  # in place
        s = torch.empty(2, 4)
        bumped(s, lambda: c.reduce_scatter(x, out=s))
        xi = x.clone()
        bumped(xi, lambda: c.reduce_scatter(xi, out=xi.chunk(w)[c.rank]))  # in place, x's shard
        xo = x.clone()
        bumped(xo, lambda: c.reduce_scatter(xo, out=xo))
        m = [torch.empty(2, 4), torch.empty(1, 4)]
        v = [t._version for t in m]
        c.reduce_scatter_many([x, x[:w]], outs=m)
        seen += [t._version > v0 for t, v0 in zip(m, v)]
        xm = x.clone()
        bumped(xm, lambda: c.reduce_scatter_many([xm], outs=[xm]))
        r, fx, fy = torch.ones(2 * w, 4), x.clone(), torch.empty(2 * w, 4)
        vr = r._version
        bumped(fy, lambda: c.all_reduce_residual_rmsnorm(fx, r, torch.ones(4), out=fy))
        seen.append(r._version > vr)
        r2, fx2 = torch.ones(2 * w, 4), x.clone()
        vr = r2._version
        bumped(fx2, lambda: c.all_reduce_residual_rmsnorm(fx2, r2, torch.ones(4)))  # y into x
        seen.append(r2._version > vr)
        return seen

    for seen in on_ranks(group, f):
        assert all(seen), seen


def test_leaf_that_requires_grad_is_refused_as_output(group):
    torch = need_torch()
    c, w = group[0], len(group)
    a = torch.ones(4, requires_grad=True)
    with pytest.raises(detcoll.InvalidArgument, match="leaf.*requires grad"):
        c.all_reduce(a)
    with pytest.raises(detcoll.InvalidArgument, match="out: .*leaf.*requires grad"):
        c.all_reduce(torch.ones(4), out=a)
    with pytest.raises(detcoll.InvalidArgument, match="out: .*view of a leaf.*requires grad"):
        c.all_reduce(torch.ones(2), out=a[:2])
    with pytest.raises(detcoll.InvalidArgument, match="residual: .*leaf.*requires grad"):
        c.all_reduce_residual_rmsnorm(torch.ones(1, 4), a.view(1, 4), torch.ones(4))
    with pytest.raises(detcoll.InvalidArgument, match=r"outs\[0\]: .*leaf.*requires grad"):
        c.reduce_scatter_many([torch.ones(w)], outs=[torch.ones(1, requires_grad=True)])
    xr = torch.ones(2 * w, requires_grad=True)
    with pytest.raises(detcoll.InvalidArgument, match="out: .*view of a leaf.*requires grad"):
        c.reduce_scatter(xr, out=xr.chunk(w)[0])  # in place: out is x's shard
    with pytest.raises(detcoll.InvalidArgument, match="x: .*leaf.*requires grad"):
        c.reduce_scatter(xr, out=xr)
    assert torch.equal(xr.detach(), torch.ones(2 * w)) and xr._version == 0
    assert torch.equal(a.detach(), torch.ones(4)) and a._version == 0
    # a leaf only read, and a leaf written under no_grad (as torch allows): fine on every rank
    leaves = [torch.ones(4, requires_grad=True) for _ in group]

    def ok(c):
        out = c.all_reduce(leaves[c.rank], out=torch.empty(4))
        with torch.no_grad():
            c.all_reduce(leaves[c.rank])
        return out

    for out, leaf in zip(on_ranks(group, ok), leaves):
        assert torch.equal(out, torch.full((4,), float(w)))
        assert torch.equal(leaf.detach(), torch.full((4,), float(w)))


def test_inference_tensor_written_outside_inference_mode_is_refused(group):
    torch = need_torch()
    c, w = group[0], len(group)
    with torch.inference_mode():
        its = [torch.ones(3) for _ in group]
    with pytest.raises(detcoll.InvalidArgument, match="inference"):
        c.all_reduce(its[0])
    with pytest.raises(detcoll.InvalidArgument, match="out: .*inference"):
        c.all_reduce(torch.ones(3), out=its[0])
    assert torch.equal(its[0], torch.ones(3))
    # read outside inference mode: fine; written inside it: fine (as torch's own ops)
    outs = each_rank(group, lambda c: c.all_reduce(its[c.rank], out=torch.empty(3)))

    def inside(c):
        with torch.inference_mode():
            return c.all_reduce(its[c.rank])

    for o, i in zip(outs, on_ranks(group, inside)):
        assert torch.equal(o, torch.full((3,), float(w))) and torch.equal(i, torch.full((3,), float(w)))


# -- 3. tensors without memory, batched, sparse, nested ------------------------------------------
class AtAddress:
    def __init__(self, addr, n):
        self.__array_interface__ = {"version": 3, "shape": (n,), "typestr": "<f4", "data": (addr, False)}


def test_array_interface_at_address_zero_is_refused():
    c = detcoll.create_deterministic_collective(device="cpu")
    out = np.full(16, -7.25, np.float32)
    with pytest.raises(detcoll.InvalidArgument, match=r"x: .*address 0"):
        c.all_reduce(AtAddress(0, 16), out=out)
    with pytest.raises(detcoll.InvalidArgument, match=r"out: .*address 0"):
        c.all_reduce(np.ones(16, np.float32), out=AtAddress(0, 16))
    with pytest.raises(detcoll.InvalidArgument, match=r"weight: .*address 0"):
        c.all_reduce_residual_rmsnorm(np.ones((1, 16), np.float32), out.reshape(1, 16), AtAddress(0, 16))
    assert (out == -7.25).all()
    c.all_reduce(AtAddress(0, 0), out=np.zeros(0, np.float32))  # nothing to read: no memory needed
    c.close()


def storageless():
    torch = need_torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    class Wrap(torch.Tensor):
        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

        def __init__(self, inner):
            self.inner = inner

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            unwrap = lambda t: t.inner if isinstance(t, Wrap) else t  # noqa: E731
            return func(*[unwrap(a) for a in args], **{k: unwrap(v) for k, v in (kwargs or {}).items()})

    with FakeTensorMode():
        fake = torch.ones(1 << 12)
    wrap = Wrap(torch.ones(1 << 12))
    assert wrap.data_ptr() == 0  # (a FakeTensor's is 0 too, with a deprecation warning)
    return {"fake": fake, "wrapper": wrap}


@pytest.mark.parametrize("kind", ["fake", "wrapper"])
def test_tensors_without_storage_are_refused(kind):
    torch = need_torch()
    x = storageless()[kind]
    c = detcoll.create_deterministic_collective(device="cpu")
    out = torch.full((1 << 12,), -7.25)
    with pytest.raises(detcoll.InvalidArgument, match=r"x: .*no memory"):
        c.all_reduce(x, out=out)
    with pytest.raises(detcoll.InvalidArgument, match=r"x: .*no memory"):
        c.all_reduce(x)
    with pytest.raises(detcoll.InvalidArgument, match=r"out: .*no memory"):
        c.all_reduce(torch.ones(1 << 12), out=x)
    with pytest.raises(detcoll.InvalidArgument, match=r"x: .*no memory"):
        c.all_gather(x, out=out)
    assert bool((out == -7.25).all())
    c.close()


def test_vmap_batched_tensor_is_a_typed_error():
    torch = need_torch()
    c = detcoll.create_deterministic_collective(device="cpu")
    out = torch.full((3,), -7.25)
    errors = []

    def f(x):
        try:
            c.all_reduce(x, out=out)
        except Exception as e:  # noqa: BLE001 (the type is the point)
            errors.append(e)
        return x

    torch.vmap(f)(torch.ones(2, 3))
    assert len(errors) == 1 and isinstance(errors[0], detcoll.InvalidArgument), errors
    assert bool((out == -7.25).all())
    c.close()


def test_sparse_and_nested_tensors_are_typed_errors():
    torch = need_torch()
    c = detcoll.create_deterministic_collective(device="cpu")
    out = torch.full((4,), -7.25)
    cases = {
        "sparse_coo": torch.ones(4).to_sparse(),
        "sparse_csr": torch.eye(2).to_sparse_csr(),
        "nested": torch.nested.nested_tensor([torch.ones(2), torch.ones(2)]),
        "jagged": torch.nested.nested_tensor([torch.ones(2), torch.ones(2)], layout=torch.jagged),
    }
    for name, x in cases.items():
        for call in (lambda: c.all_reduce(x, out=out), lambda: c.all_reduce(torch.ones(4), out=x)):
            with pytest.raises(detcoll.InvalidArgument, match=name) as e:
                call()
            assert type(e.value) is detcoll.InvalidArgument, (name, e.value)
    assert bool((out == -7.25).all())
    c.close()


# -- 4. reduce_scatter's in-place shard form checks out's dtype ---------------------------------
def test_reduce_scatter_in_place_shard_of_another_dtype_is_refused(group):
    w = len(group)
    xs = [np.arange(2.0 * w, dtype=np.float32) + r for r in range(w)]
    before = [x.copy() for x in xs]

    def call(c):
        x = xs[c.rank]
        return c.reduce_scatter(x, out=x[2 * c.rank:2 * c.rank + 2].view(np.int32))

    for e in each_rank(group, call):
        assert isinstance(e, detcoll.DtypeMismatch) and "i32" in str(e) and "f32" in str(e), e
    for x, b in zip(xs, before):
        assert (x.view(np.int32) == b.view(np.int32)).all()


def test_reduce_scatter_in_place_shard_of_another_dtype_is_refused_torch(group):
    torch = need_torch()
    w = len(group)
    ys = [torch.arange(2.0 * w, dtype=torch.bfloat16) for _ in group]
    call = lambda c: c.reduce_scatter(ys[c.rank], out=ys[c.rank].chunk(w)[c.rank].view(torch.float16))  # noqa: E731
    for e in each_rank(group, call):
        assert isinstance(e, detcoll.DtypeMismatch), e
    for y in ys:
        assert torch.equal(y, torch.arange(2.0 * w, dtype=torch.bfloat16))


# -- 5. reduce_scatter_many takes the in-place shard form per lane ------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=lambda d: np.dtype(d).name)
def test_reduce_scatter_many_in_place_shard_per_lane(group, dtype):
    w = len(group)
    rng = np.random.default_rng(7)
    a = [(rng.standard_normal((4 * w, 3)) * 1e3).astype(dtype) for _ in group]
    b = [(rng.standard_normal(2 * w) * 1e-2).astype(dtype) for _ in group]
    want_a, want_b = tree(a), tree(b)
    xa, xb = [x.copy() for x in a], [x.copy() for x in b]

    def call(c):
        r = c.rank
        sa, sb = xa[r][4 * r:4 * r + 4], xb[r][2 * r:2 * r + 2]  # x's shard rank: in place
        out_b = np.empty(2, dtype)
        res = c.reduce_scatter_many([xa[r], xb[r]], outs=[sa, out_b])  # lane 0 in place, lane 1 not
        assert res[0] is sa and res[1] is out_b
        c.reduce_scatter_many([xb[r]], outs=[sb])
        return sa.copy(), out_b, sb.copy()

    for r, (sa, ob, sb) in enumerate(on_ranks(group, call)):
        assert (sa.view(np.uint8) == want_a[4 * r:4 * r + 4].view(np.uint8)).all()
        assert (ob.view(np.uint8) == want_b[2 * r:2 * r + 2].view(np.uint8)).all()
        assert (sb.view(np.uint8) == want_b[2 * r:2 * r + 2].view(np.uint8)).all()


def test_reduce_scatter_many_in_place_shard_torch(group):
    torch = need_torch()
    w = len(group)
    xs = [torch.randn(8 * w, 3, generator=torch.Generator().manual_seed(r)).to(torch.bfloat16) * 100 for r in range(w)]
    want = tree(xs)
    work = [x.clone() for x in xs]
    got = on_ranks(group, lambda c: c.reduce_scatter_many([work[c.rank]], outs=[work[c.rank].chunk(w)[c.rank]])[0])
    for r, g in enumerate(got):
        assert torch.equal(tbits(g), tbits(want.chunk(w)[r]))


def test_reduce_scatter_many_overlap_that_is_not_the_shard_is_the_same_error_on_every_rank(group):
    w = len(group)
    xs = [np.ones((2 * w, 3), np.float32) for _ in group]
    # every rank passes the next rank's shard of its input (not its own: refused on every rank
    # alike), then its own shard in another dtype (refused alike too)
    errs = each_rank(group, lambda c: c.reduce_scatter_many(
        [xs[c.rank]], outs=[xs[c.rank][2 * ((c.rank + 1) % w):2 * ((c.rank + 1) % w) + 2]]))
    assert all(type(e) is detcoll.Overlap and "reduce_scatter_many" in str(e) and "outs[0]" in str(e) for e in errs), errs
    errs = each_rank(group, lambda c: c.reduce_scatter_many(
        [xs[c.rank]], outs=[xs[c.rank][2 * c.rank:2 * c.rank + 2].view(np.int32)]))
    assert all(type(e) is detcoll.DtypeMismatch for e in errs), errs
    assert all((x == 1).all() for x in xs)


# -- 6. route and a 0-d reduce_scatter -----------------------------------------------------------
def test_route_of_a_negative_or_huge_size_is_invalid_argument():
    c = detcoll.create_deterministic_collective(device="cpu")
    for n in (-1, 1 << 70):
        with pytest.raises(detcoll.InvalidArgument, match="nbytes"):
            c.route("all_reduce", n)
    assert isinstance(c.route("all_reduce", 0), str)
    c.close()


def test_zero_d_reduce_scatter_says_the_input_is_a_scalar(group):
    c = group[0]
    for many in (False, True):
        with pytest.raises(detcoll.NotDivisible, match=r"0-d \(a scalar\)") as e:
            c.reduce_scatter_many([np.array(1.0, np.float32)]) if many else c.reduce_scatter(np.array(1.0, np.float32))
        assert "dim 0 of the input is 1" not in str(e.value)
        assert ("reduce_scatter_many" in str(e.value)) == many


# -- 7. the vLLM communicator --------------------------------------------------------------------
def test_vllm_communicator_attributes(group, monkeypatch):
    from detcoll import vllm_communicator as vc

    w = len(group)
    built = []
    for c in group:  # over the thread group's ranks: no bootstrap to run
        monkeypatch.setattr(vc, "create_deterministic_collective", lambda c=c, **kw: c)
        built.append(vc.DetcollCommunicator(cpu_group=None, device="cpu"))
    for r, d in enumerate(built):
        assert (d.rank, d.world_size, d.rank_in_group) == (r, w, r)
        assert list(d.ranks) == list(range(w))
        assert d.global_rank == r and d.global_world_size == w


def test_vllm_communicator_documents_the_calls_it_does_not_route():
    import os

    from detcoll import vllm_communicator as vc

    for text in (vc.__doc__, open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()):
        assert "all_gatherv" in text and "reduce_scatterv" in text
        assert "not routed through detcoll" in " ".join(text.split())
