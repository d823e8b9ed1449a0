"""The launcher (``python -m detcoll.launch``, ``detcoll.launch.launch``) as a job runs it: a rank
that fails is seen whichever rank it is, the exit status is the first failing rank's in time,
and a launcher stopped by a signal leaves no rank running."""

import os
import signal
import subprocess
import sys
import time

from detcoll.launch import launch, main


def script(tmp_path, name, body):
    path = tmp_path / name
    path.write_text("import os, sys, time\nrank = int(os.environ['RANK'])\n" + body)
    return str(path)


def test_a_failing_rank_other_than_0_stops_the_job_after_the_grace(tmp_path):
    # Rank 1 fails at once, rank 0 would sleep 60 s: the poll used to stop at the first
    # running rank and never saw rank 1, so the job ran to its timeout.
    s = script(tmp_path, "r1_fails.py", "sys.exit(3) if rank == 1 else time.sleep(60)\n")
    t = time.monotonic()
    results = launch(2, [sys.executable, s], timeout=60, grace=1)
    took = time.monotonic() - t
    assert took < 15, took
    assert results.first_failure == 1
    assert results[1].returncode == 3
    assert results[0].returncode == -signal.SIGKILL


def test_the_exit_status_is_the_first_failing_ranks_in_time(tmp_path, capsys):
    # Rank 1 fails first (7); rank 0 fails later (1), as a peer of a dead rank does.
    s = script(tmp_path, "cascade.py", "sys.exit(7) if rank == 1 else (time.sleep(1.0), sys.exit(1))\n")
    assert main(["--nproc", "2", s]) == 7
    err = capsys.readouterr().err
    assert "rank 1 failed first (status 7)" in err, err
    assert "rank 0 exited with status 1" in err, err


def test_a_launcher_stopped_by_sigterm_or_sigint_stops_its_ranks(tmp_path):
    s = script(tmp_path, "sleeper.py",
               f"open(os.path.join({str(tmp_path)!r}, f'pid{{rank}}'), 'w').write(str(os.getpid()))\n"
               "time.sleep(60)\n")
    for sig in (signal.SIGTERM, signal.SIGINT):
        for f in tmp_path.glob("pid*"):
            f.unlink()
        # SIGINT as a terminal delivers it: a job started in the background of a non-interactive
        # shell (CI) inherits SIGINT ignored, which the launcher rightly keeps ignoring.
        launcher = subprocess.Popen([sys.executable, "-m", "detcoll.launch", "--nproc", "2", s],
                                    stderr=subprocess.DEVNULL,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("pid*"))) < 2 or any(f.read_text() == "" for f in tmp_path.glob("pid*")):
            assert time.monotonic() < deadline, "ranks did not start"
            time.sleep(0.05)
        pids = [int(f.read_text()) for f in tmp_path.glob("pid*")]
        launcher.send_signal(sig)
        try:
            launcher.wait(timeout=10)
        except subprocess.TimeoutExpired:
            launcher.kill()
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"{sig!r}: the launcher did not stop")
        assert launcher.returncode != 0, sig
        deadline = time.monotonic() + 5
        for pid in pids:
            while True:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                assert time.monotonic() < deadline, f"{sig!r}: rank pid {pid} outlived its launcher"
                time.sleep(0.05)


def test_every_rank_gets_torchruns_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("GROUP_RANK", "5")  # a stale value from the environment is replaced
    s = script(tmp_path, "env.py",
               "print(' '.join(os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE',"
               " 'GROUP_RANK', 'MASTER_ADDR')))\n")
    results = launch(3, [sys.executable, s], timeout=60, capture=True)
    lines = [r.stdout.decode().strip() if isinstance(r.stdout, bytes) else r.stdout.strip() for r in results]
    assert lines == [f"{r} 3 {r} 3 0 127.0.0.1" for r in range(3)], lines
