"""Ranks as real processes on the CPU twin (host shared memory), bootstrapped as users run
them: torchrun's variables and a job token (detcoll.launch), or a torch.distributed gloo group."""

import os
import sys

import numpy as np
import pytest

from detcoll.launch import launch
from reference import BF16, REDUCE_DTYPES, assert_bits_equal, contribution, tree

WORKER = os.path.join(os.path.dirname(__file__), "rank_worker.py")
N = 8 * 1000 + 8


def run(mode, world, tmp_path, env=None):
    results = launch(world, [sys.executable, WORKER, mode, str(tmp_path)], timeout=120, env=env, capture=True)
    for r, res in enumerate(results):
        assert res.returncode == 0, f"rank {r} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return results


def check_ops(world, tmp_path):
    got = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(world)]
    checked = 0
    for dt in REDUCE_DTYPES:
        if dt == "bf16" and BF16 is None:
            continue
        xs = [contribution(dt, r, N) for r in range(world)]
        lane1 = [contribution(dt, r, 16 * world, seed=5) for r in range(world)]
        full, full1 = tree(xs), tree(lane1)
        s, s1 = N // world, 16
        for r in range(world):
            view = (lambda a: a.view(BF16)) if dt == "bf16" else (lambda a: a)
            g = {k: view(v) for k, v in got[r].items() if k.endswith(dt)}
            assert_bits_equal(g[f"all_reduce_{dt}"], full, f"rank {r} all_reduce {dt}")
            assert_bits_equal(g[f"all_gather_{dt}"], np.concatenate(xs), f"rank {r} all_gather {dt}")
            assert_bits_equal(g[f"reduce_scatter_{dt}"], full[r * s:(r + 1) * s], f"rank {r} reduce_scatter {dt}")
            assert_bits_equal(g[f"many0_{dt}"], full[r * s:(r + 1) * s], f"rank {r} lane 0 {dt}")
            assert_bits_equal(g[f"many1_{dt}"], full1[r * s1:(r + 1) * s1], f"rank {r} lane 1 {dt}")
            checked += 5
    routes = {str(got[r]["route"]) for r in range(world)}
    assert len(routes) == 1, f"ranks disagree on the route: {routes}"
    return checked


@pytest.mark.parametrize("world", [2, 4])
def test_env_bootstrap(world, tmp_path):
    run("ops", world, tmp_path)
    assert check_ops(world, tmp_path) >= 5 * 2 * world


def test_mismatched_calls_fail_on_every_rank(tmp_path):
    run("mismatch", 2, tmp_path, env={**os.environ, "DETCOLL_TIMEOUT_MS": "3000"})
    names = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert all(n in ("SignatureMismatch", "PeerTimeout", "Poisoned") for n in names), names


def test_close_after_a_peer_exited_does_not_wait_the_bound(tmp_path):
    # Before, close waited the whole close bound (here 20 s) and raised PeerTimeout.
    run("peer_exits", 2, tmp_path, env={**os.environ, "DETCOLL_TIMEOUT_MS": "20000"})
    name, took = (tmp_path / "rank0.txt").read_text().split()
    assert name == "PeerDied", name
    assert float(took) < 5.0, took


def test_torch_gloo_group(tmp_path):
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("torch is not installed: the torch.distributed group bootstrap is tested where it is")
    run("torch_group", 2, tmp_path)
    assert check_ops(2, tmp_path) >= 5 * 2 * 2


def test_launch_cli_reports_the_failing_rank(tmp_path):
    from detcoll.launch import main

    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys\n"
        "env = {k: os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_PORT', 'DETCOLL_JOB_TOKEN')}\n"
        "assert env['WORLD_SIZE'] == '2' and len(env['DETCOLL_JOB_TOKEN']) == 32\n"
        "sys.exit(3 if env['RANK'] == '1' else 0)\n"
    )
    assert main(["--nproc", "2", str(script)]) == 3
    script.write_text("pass\n")
    assert main(["--nproc", "2", str(script)]) == 0
