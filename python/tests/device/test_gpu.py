"""GPU checks (run by run.sh on a CUDA host): torch tensors at worlds 1/2/4/8 as processes on
the GPUs present (several ranks per GPU under MPS, gloo as the bootstrap group), bit for bit
against torch_reference.tree; a CUDA graph capture; the same CUDA tensors handed over as
objects with only ``__cuda_array_interface__`` or only ``__dlpack__`` (standin_checks.py: bits
against plain torch calls, the stream each call goes on, strided/misaligned refusals); the TP
MLP example.

Runs under pytest, or as ``python test_gpu.py`` where pytest is not installed."""

import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


class Skipped(Exception):
    """A skip outside pytest (the minimal runner below)."""


try:
    import pytest

    skip = pytest.skip
    parametrize = pytest.mark.parametrize
    SKIPS = (Skipped, pytest.skip.Exception)
except ImportError:  # the minimal runner below
    SKIPS = (Skipped,)

    def skip(reason):
        raise Skipped(reason)

    def parametrize(name, values):
        def mark(fn):
            fn.params = (name, values)
            return fn

        return mark


OUT = os.environ.get("DETCOLL_TEST_OUT") or os.path.join(HERE, "out")
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def need_gpu_ranks(world):
    try:
        import torch
    except ImportError:
        skip("torch is not installed")
    if not torch.cuda.is_available():
        skip("no CUDA device visible to torch")
    if world > torch.cuda.device_count() and os.environ.get("DETCOLL_TEST_MPS") != "1":
        skip(f"{world} ranks on {torch.cuda.device_count()} GPU(s) need MPS (run.sh starts it; set DETCOLL_TEST_MPS=1)")


def run_ranks(mode, world, tmp):
    from detcoll.launch import launch

    os.makedirs(tmp, exist_ok=True)
    env = dict(os.environ, DETCOLL_TIMEOUT_MS=os.environ.get("DETCOLL_TIMEOUT_MS", "20000"))
    results = launch(world, [sys.executable, os.path.join(HERE, "gpu_worker.py"), mode, tmp], timeout=120,
                     env=env, capture=True)
    with open(os.path.join(tmp, "ranks.log"), "w") as f:
        for r, res in enumerate(results):
            f.write(f"--- rank {r} exit {res.returncode}\n{res.stdout}\n{res.stderr}\n")
    for r, res in enumerate(results):
        assert res.returncode == 0, f"{mode} world {world}: rank {r} exited {res.returncode}:\n{res.stderr[-3000:]}"


def record(name, payload):
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "summary.jsonl"), "a") as f:
        f.write(json.dumps({"check": name, **payload}) + "\n")


@parametrize("world", [1, 2, 4, 8])
def test_ops_bitwise(world):
    need_gpu_ranks(world)
    import torch
    from gpu_worker import LARGE, SMALL
    from torch_reference import DTYPES, contribution, differing, tree

    tmp = os.path.join(OUT, f"ops_w{world}")
    run_ranks("ops", world, tmp)
    got = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)]
    checked, bad = 0, []
    for name, dt in DTYPES.items():
        for n in (SMALL, LARGE if name == "bf16" else SMALL * 8):
            xs = [contribution(name, r, n) for r in range(world)]
            full, gathered, s = tree(xs), torch.cat(xs), n // world
            for r in range(world):
                want = {
                    f"ar_inplace_{name}_{n}": full, f"ar_out_{name}_{n}": full,
                    f"ag_{name}_{n}": gathered, f"rs_{name}_{n}": full[r * s:(r + 1) * s],
                }
                for key, w in want.items():
                    d = differing(got[r][key].view(dt), w)
                    checked += 1
                    if d:
                        bad.append(f"rank {r} {key}: {d} elements differ")
        for i, m in enumerate((16, 64)):
            lane = tree([contribution(name, r, m * world, seed=5 + i) for r in range(world)])
            for r in range(world):
                d = differing(got[r][f"many{i}_{name}"].view(dt), lane[r * m:(r + 1) * m])
                checked += 1
                if d:
                    bad.append(f"rank {r} lane {i} {name}: {d} elements differ")
    timing = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(world)]
    record(f"ops_w{world}", {"results_checked": checked, "mismatches": len(bad), "timing_rank0": timing[0]})
    assert not bad, "\n".join(bad[:20])


@parametrize("world", [1, 2])
def test_cuda_graph_replay(world):
    need_gpu_ranks(world)
    import torch
    from torch_reference import contribution, differing, tree

    tmp = os.path.join(OUT, f"graph_w{world}")
    run_ranks("graph", world, tmp)
    got = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)]
    errors = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(world)]
    bad = [f"rank {r} {mode} capture failed: {e}" for r, errs in enumerate(errors) for mode, e in errs.items()]
    for mode, replay in [(m, i) for m in ("thread_local", "global") for i in range(3)]:
        xs = [contribution("bf16", r, 4096, seed=100 + replay) for r in range(world)]
        for r in range(world):
            if mode in errors[r]:
                continue
            for key, want in ((f"{mode}_ar_{replay}", tree(xs)), (f"{mode}_ag_{replay}", torch.cat(xs))):
                d = differing(got[r][key].view(torch.bfloat16), want)
                if d:
                    bad.append(f"rank {r} {key}: {d} differ")
    record(f"graph_w{world}", {"capture_modes": ["thread_local", "global"], "replays": 3, "mismatches": len(bad)})
    assert not bad, "\n".join(bad)


def cpu_twin_norm(world, rows, hidden, name):
    """(y, h) per rank of the same fused call on the CPU twin (ranks as threads of this process):
    the oracle, itself checked bit for bit against a numpy evaluation of the contract in CI
    (python/tests/test_fused_norm.py)."""
    import threading

    import detcoll
    from gpu_worker import NORM_EPS, norm_inputs

    comms = detcoll.thread_group(world, capacity=1 << 20)
    out, errors = [None] * world, []

    def run(c):
        try:
            x, residual, weight = norm_inputs(c.rank, rows, hidden, name)
            out[c.rank] = c.all_reduce_residual_rmsnorm(x, residual, weight, eps=NORM_EPS)
        except Exception as e:  # raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    closers = [threading.Thread(target=c.close) for c in comms]  # collective: every rank at once
    for t in closers:
        t.start()
    for t in closers:
        t.join(60)
    if errors:
        raise errors[0]
    return out


@parametrize("world", [1, 2, 4, 8])
def test_fused_norm_bitwise(world):
    """``all_reduce_residual_rmsnorm`` on CUDA tensors (rank processes): y and the updated
    residual of every rank, in place and with ``out=``, bit for bit the CPU twin's; the 1-row
    call's row equal to row 0 of the 8-row call (batch invariance)."""
    need_gpu_ranks(world)
    import torch
    from gpu_worker import NORM_SHAPES
    from torch_reference import differing

    tmp = os.path.join(OUT, f"fused_norm_w{world}")
    run_ranks("fused_norm", world, tmp)
    got = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)]
    checked, bad = 0, []
    for rows, hidden, name in NORM_SHAPES:
        key = f"{rows}x{hidden}_{name}"
        want = cpu_twin_norm(world, rows, hidden, name)
        for r in range(world):
            for form in ("out", "inplace"):
                for i, part in enumerate(("y", "h")):
                    d = differing(got[r][f"{part}_{form}_{key}"], want[r][i])
                    checked += 1
                    if d:
                        bad.append(f"rank {r} {part} {form} {key}: {d} elements differ from the CPU twin")
    for r in range(world):
        one, eight = got[r]["y_out_1x4096_bf16"], got[r]["y_out_8x4096_bf16"]
        checked += 1
        if not torch.equal(one.flatten(), eight[:1].flatten()):
            bad.append(f"rank {r}: the 1-row call's y differs from row 0 of the 8-row call")
    record(f"fused_norm_w{world}", {"results_checked": checked, "mismatches": len(bad)})
    assert not bad, "\n".join(bad[:20])


def run_standin_mode(mode, world):
    """One stand-in mode (standin_checks.py) at ``world``: the ranks' reports, recorded."""
    tmp = os.path.join(OUT, f"{mode}_w{world}")
    run_ranks(mode, world, tmp)
    reports = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(world)]
    failures = [f"rank {r}: {f}" for r, rep in enumerate(reports) for f in rep["failures"]]
    summary = {k: v for k, v in reports[0].items() if k not in ("checked", "failures")}
    record(f"{mode}_w{world}", {"results_checked": sum(rep["checked"] for rep in reports),
                                "failures": len(failures), **summary, "first_failures": failures[:5]})
    assert all(rep["checked"] for rep in reports), f"{mode} world {world}: a rank checked nothing"
    assert not failures, "\n".join(failures[:30])


@parametrize("world", [1, 2, 8])
def test_standins_bitwise(world):
    """CUDA tensors as __cuda_array_interface__-only / DLPack-only objects: every op and form,
    bit for bit against the same calls on the plain torch tensors."""
    need_gpu_ranks(world)
    run_standin_mode("standins", world)


@parametrize("world", [1, 2])
def test_standins_stream(world):
    """The array interface's stream is the call's stream; without one (and for DLPack) the
    default stream, torch's current one; graph capture through each kind."""
    need_gpu_ranks(world)
    run_standin_mode("standin_streams", world)


@parametrize("world", [1, 2])
def test_standins_refused(world):
    """Strided and misaligned stand-ins: NotContiguous / Misaligned, nothing written."""
    need_gpu_ranks(world)
    run_standin_mode("standin_refusals", world)


def test_tp_mlp_example():
    need_gpu_ranks(8)
    example = os.path.join(REPO, "python", "examples", "tp_mlp.py")
    out_dir = os.path.join(OUT, "tp_mlp")
    proc = subprocess.run([sys.executable, example, "--tp", "1", "2", "4", "8", "--out-dir", out_dir, "--timeout", "90"],
                          capture_output=True, text=True, timeout=240)
    with open(os.path.join(OUT, "tp_mlp.log"), "w") as f:
        f.write(proc.stdout + "\n" + proc.stderr)
    record("tp_mlp", {"exit": proc.returncode, "summary": proc.stdout.strip().splitlines()[-6:]})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "bit-identical at TP 1, 2, 4, 8" in proc.stdout


def _main():
    """Runs every test_* function (each parameter) and prints one line each."""
    failed = 0
    for name, fn in sorted(globals().items()):
        if not name.startswith("test_") or not callable(fn):
            continue
        # pytest's marks when pytest is installed (the file run by hand)
        marks = [m.args for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
        pname, values = getattr(fn, "params", marks[0] if marks else (None, [None]))
        for v in values:
            label = f"{name}[{v}]" if pname else name
            try:
                fn(v) if pname else fn()
                print(f"PASSED  {label}", flush=True)
            except SKIPS as e:
                print(f"SKIPPED {label}: {e}", flush=True)
            except Exception as e:  # report and go on with the next check
                failed += 1
                print(f"FAILED  {label}: {type(e).__name__}: {str(e)[:2000]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_main())
