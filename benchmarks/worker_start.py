#!/usr/bin/env python3
"""How the engine's GPU workers start on this machine: forked from the zygote or spawned, and
the seconds each took (imports, CUDA context), with the zygote's log when forking was given up.

    python3 benchmarks/worker_start.py [--workers N] [--preload cuda|cpu]

Prints one line per worker (start mode, start-up seconds, preload steps), the pool's
``fork_failure`` and the zygote's log tail. On a GPU audit workers should be forked: a spawned
worker pays torch's and FA4's imports itself (about 15 s on the H200 host).
"""
from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--preload", default="cuda", choices=("cuda", "cpu", "none"))
    a = ap.parse_args()
    from fa4verify.run.pool import WorkerPool
    t0 = time.time()
    pool = WorkerPool(a.workers, preload=a.preload)
    try:
        pool.prestart()
        print(f"pool start mode {pool.start!r}; zygote {'yes' if pool._zygote else 'no'}")
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(a.workers) as ex:
            outs = list(ex.map(lambda _i: pool._run({"call": "builtins:len", "payload": []}, 120, None),
                               range(a.workers)))
        for i, (_payload, timing) in enumerate(outs):
            print(f"worker {i}: {timing.get('worker_start')} start {timing.get('worker_start_s')} s, "
                  f"waited {timing.get('worker_wait_s')} s, preload {timing.get('preload')}, "
                  f"zygote ready {timing.get('zygote_ready_s')} s, fork_failed {timing.get('fork_failed')}")
        print(f"all answered {time.time() - t0:.1f} s after the pool was made; fork_failure: {pool.fork_failure}")
        z = pool._zygote
        if z is not None:
            print("zygote ready:", z.ready, "usable:", z.usable, "alive:", z.proc.poll() is None)
            with open(z.log_path, "rb") as f:
                print("zygote log tail:\n" + f.read()[-3000:].decode("utf-8", "replace"))
    finally:
        pool.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
