"""A ``torchrun --standalone``-like launcher for ranks without torch:
``python -m detcoll.launch --nproc 4 script.py [args]``.

Each rank gets torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK=0``, ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``) and one random
``DETCOLL_JOB_TOKEN`` for the job, which the Rust rendezvous requires every rank to prove. When
one rank fails, the others are stopped (after a grace period in which they report their own
errors). The exit status is the first failing rank's (in time). A launcher stopped by Ctrl-C or
SIGTERM stops its ranks first.
"""

import argparse
import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Sequence


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, nproc: int, port: int, token: str, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """The environment of rank ``rank`` of ``nproc`` on this host."""
    env = dict(os.environ if base is None else base)
    env.update(
        RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
        GROUP_RANK="0",  # torchrun's node rank: one host (whatever the environment had)
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DETCOLL_JOB_TOKEN=token,
    )
    return env


def launch(nproc: int, argv: Sequence[str], timeout: float = 300.0, env: Optional[Dict[str, str]] = None,
           capture: bool = False, grace: float = 10.0) -> "Ranks":
    """Runs ``argv`` as ``nproc`` ranks and waits (at most ``timeout`` seconds, then every
    rank is killed; after one rank fails, the others are killed ``grace`` seconds later).
    Returns each rank's completed process (stdout/stderr when ``capture``), in rank order, as a
    list whose ``first_failure`` is the rank seen failing first (``None`` when none failed).

    If the launcher itself is stopped (``KeyboardInterrupt``, or SIGTERM when ``launch`` runs
    in the main thread), every rank still running is terminated (killed after 2 s) before the
    exception propagates: no rank outlives its launcher."""
    port, token = free_port(), secrets.token_hex(16)
    # Captured output goes to files: a pipe nobody reads while we poll could fill and stall a rank.
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) if capture else (None, None) for _ in range(nproc)]
    procs: List[subprocess.Popen] = []
    first_failure = None
    with _terminated_on_sigterm():
        try:
            for r, (o, e) in enumerate(files):
                procs.append(subprocess.Popen(list(argv), env=rank_env(r, nproc, port, token, env), stdout=o, stderr=e,
                                              text=True))
            deadline = time.monotonic() + timeout
            failed_at = None
            while True:
                now = time.monotonic()
                running = 0
                for r, p in enumerate(procs):  # every rank, every round: any of them may fail first
                    rc = p.poll()
                    if rc is None:
                        running += 1
                    elif rc != 0 and first_failure is None:
                        first_failure, failed_at = r, now  # the others get `grace` s to report their own error
                if running == 0:
                    break
                if now > deadline or (failed_at is not None and now > failed_at + grace):
                    _stop(procs, kill=True)
                    break
                time.sleep(0.02)
        except BaseException:
            _stop(procs, kill=False)
            raise
    done = Ranks()
    for p, (o, e) in zip(procs, files):
        p.wait()
        texts = []
        for f in (o, e):
            if f is not None:
                f.seek(0)
                texts.append(f.read())
                f.close()
            else:
                texts.append(None)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, texts[0], texts[1]))
    done.first_failure = first_failure
    return done


class Ranks(list):
    """The ranks' completed processes in rank order, and ``first_failure``: the rank the
    launcher saw failing first (non-zero status), ``None`` when none failed."""

    first_failure: Optional[int] = None


class _Terminated(Exception):
    """SIGTERM reached the launcher."""


@contextlib.contextmanager
def _terminated_on_sigterm():
    """SIGTERM raises ``_Terminated`` inside the block (main thread only: elsewhere Python
    cannot install handlers, and the caller's own handling stays)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise _Terminated()

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except _Terminated:
        raise SystemExit(128 + signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, old)


def _stop(procs: Sequence[subprocess.Popen], kill: bool) -> None:
    """Stops every rank still running: at once (``kill``), or terminated, then killed after 2 s."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        (p.kill if kill else p.terminate)()
    end = time.monotonic() + 2.0
    for p in live:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(args: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m detcoll.launch", description=__doc__)
    ap.add_argument("--nproc", type=int, required=True, help="ranks to start (1 or more)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds before every rank is killed")
    ap.add_argument("script", help="the Python script every rank runs")
    ap.add_argument("script_args", nargs=argparse.REMAINDER)
    a = ap.parse_args(args)
    results = launch(a.nproc, [sys.executable, a.script, *a.script_args], timeout=a.timeout)
    first = results.first_failure
    if first is None:
        # No rank failed before the others were stopped (the timeout): report any non-zero.
        first = next((r for r, res in enumerate(results) if res.returncode != 0), None)
    if first is None:
        return 0
    code = results[first].returncode
    print(f"detcoll.launch: rank {first} failed first (status {code})", file=sys.stderr)
    for r, res in enumerate(results):
        if r != first and res.returncode != 0:
            print(f"detcoll.launch: rank {r} exited with status {res.returncode}", file=sys.stderr)
    return code if code > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
