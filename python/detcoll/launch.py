"""A ``torchrun --standalone``-like launcher for ranks without torch:
``python -m detcoll.launch --nproc 4 script.py [args]``.

Each rank gets torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``) and one random
``DETCOLL_JOB_TOKEN`` for the job, which the Rust rendezvous requires every rank to prove. When
one rank fails, the others are stopped. The exit status is the first failing rank's.
"""

import argparse
import os
import secrets
import socket
import subprocess
import sys
import tempfile
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
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DETCOLL_JOB_TOKEN=token,
    )
    return env


def launch(nproc: int, argv: Sequence[str], timeout: float = 300.0, env: Optional[Dict[str, str]] = None,
           capture: bool = False, grace: float = 10.0) -> List[subprocess.CompletedProcess]:
    """Runs ``argv`` as ``nproc`` ranks and waits (at most ``timeout`` seconds, then every
    rank is killed; after one rank fails, the others are killed ``grace`` seconds later). Returns each rank's completed process (stdout/stderr when ``capture``)."""
    port, token = free_port(), secrets.token_hex(16)
    # Captured output goes to files: a pipe nobody reads while we poll could fill and stall a rank.
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) if capture else (None, None) for _ in range(nproc)]
    procs = [
        subprocess.Popen(list(argv), env=rank_env(r, nproc, port, token, env), stdout=o, stderr=e, text=True)
        for r, (o, e) in enumerate(files)
    ]
    deadline = time.monotonic() + timeout
    failed_at = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
            failed_at = now  # the others get `grace` seconds to report their own error
        if now > deadline or (failed_at is not None and now > failed_at + grace):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.02)
    done = []
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
    return done


def main(args: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m detcoll.launch", description=__doc__)
    ap.add_argument("--nproc", type=int, required=True, help="ranks to start (1, 2, 4 or 8)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds before every rank is killed")
    ap.add_argument("script", help="the Python script every rank runs")
    ap.add_argument("script_args", nargs=argparse.REMAINDER)
    a = ap.parse_args(args)
    results = launch(a.nproc, [sys.executable, a.script, *a.script_args], timeout=a.timeout)
    for r, res in enumerate(results):
        if res.returncode != 0:
            print(f"detcoll.launch: rank {r} exited with status {res.returncode}", file=sys.stderr)
            return res.returncode if res.returncode > 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
