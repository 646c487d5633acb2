"""The fast reference gives bit-identical results with 1 or several worker threads."""
from __future__ import annotations

import numpy as np
import pytest

from fa4verify.oracles import attention


def _run():
    rng = np.random.default_rng(0)
    q, do = rng.standard_normal((2, 40, 6, 16)), rng.standard_normal((2, 40, 6, 16))
    k, v = rng.standard_normal((2, 50, 2, 16)), rng.standard_normal((2, 50, 2, 16))
    q, k, v, do = (t.astype(np.float32) for t in (q, k, v, do))
    sink = rng.standard_normal(6).astype(np.float32)
    return attention.backward(q, k, v, None, do, causal=True, softcap=4.0, learnable_sink=sink)


def test_threaded_and_single_threaded_results_are_bitwise_identical(monkeypatch):
    from fa4verify.oracles import reference
    monkeypatch.setattr(reference, "_THREAD_MIN_WORK", 0)     # these small tasks on the pool too
    monkeypatch.setenv("FA4VERIFY_ORACLE_THREADS", "1")
    a = _run()
    monkeypatch.setenv("FA4VERIFY_ORACLE_THREADS", "3")
    b = _run()
    for n in ("dq", "dk", "dv", "dsink", "d", "dq_bound", "dk_bound", "dv_bound", "dsink_bound"):
        assert np.array_equal(getattr(a, n), getattr(b, n)), n
    assert np.array_equal(a.forward.out, b.forward.out) and np.array_equal(a.forward.bound, b.forward.bound)


def test_bad_thread_setting_is_a_value_error(monkeypatch):
    monkeypatch.setenv("FA4VERIFY_ORACLE_THREADS", "many")
    with pytest.raises(ValueError, match="FA4VERIFY_ORACLE_THREADS"):
        _run()


def test_small_tasks_run_in_the_calling_thread(monkeypatch):
    """Tasks below ``_THREAD_MIN_WORK`` never reach a pool (they would only contend for the GIL);
    larger ones do."""
    from fa4verify.oracles import reference
    made = []
    real = reference.ThreadPoolExecutor

    def pool(*a, **k):
        made.append(k.get("max_workers", a[0] if a else None))
        return real(*a, **k)
    monkeypatch.setattr(reference, "ThreadPoolExecutor", pool)
    monkeypatch.setenv("FA4VERIFY_ORACLE_THREADS", "3")
    _run()
    assert made == []
    monkeypatch.setattr(reference, "_THREAD_MIN_WORK", 0)
    _run()
    assert made and all(n == 3 for n in made)          # 2 sequences x 2 kv heads: 4 tasks on 3 threads


def test_results_do_not_depend_on_the_blas_thread_count(monkeypatch):
    """Note [One BLAS thread]: a problem whose products are large enough for OpenBLAS to use
    several threads (a 90-token sequence among one-token ones, d 72) gives the same bits in the
    calling thread and on the pool, whatever the process's BLAS thread count was before."""
    import ctypes
    import glob
    import os
    from fa4verify.oracles import reference
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*.so*"))
    pairs = [(getattr(ctypes.CDLL(x), pre + "set_num_threads" + suf, None),
              getattr(ctypes.CDLL(x), pre + "get_num_threads" + suf, None))
             for x in libs for pre, suf in (("scipy_openblas_", "64_"), ("openblas_", "64_"), ("openblas_", ""))]
    pairs = [(s_, g_) for s_, g_ in pairs if s_ is not None and g_ is not None]
    if not pairs:
        pytest.skip("numpy's OpenBLAS exports no thread-count setter here (optional: the check needs one)")
    set_threads, get_threads = pairs[0]
    start = get_threads()
    rng = np.random.default_rng(0)
    lens = [90] + [1] * 8
    T, D = sum(lens), 72
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    q, k, v, do = (rng.standard_normal((T, 1, D)).astype(np.float32) for _ in range(4))

    def run():
        r = attention.backward(q, k, v, None, do, cu_seqlens_q=cu, cu_seqlens_k=cu)
        return [np.asarray(getattr(r, n), np.float64).view(np.uint64) for n in ("dq", "dk", "dv", "dq_bound")]
    monkeypatch.setenv("FA4VERIFY_ORACLE_THREADS", "2")
    out = []
    try:
        for blas in (4, 1):
            for min_work in (reference._THREAD_MIN_WORK, 0):          # in the calling thread, on the pool
                monkeypatch.setattr(reference, "_THREAD_MIN_WORK", min_work)
                set_threads(blas)
                out.append(run())
                assert get_threads() == blas          # the oracle put the count back
    finally:
        set_threads(start)
    for o in out[1:]:
        assert all(np.array_equal(x, y) for x, y in zip(out[0], o))


def test_concurrent_oracle_calls_restore_the_blas_count_once_both_are_done():
    """Note [One BLAS thread]: two callers at once share the process-wide setting: neither
    restores it while the other runs; the count is the original once both have left."""
    import threading
    from fa4verify.oracles import reference
    seen, calls = [], []

    def setter(n):
        calls.append(n)
        old = seen[-1] if seen else 3
        seen.append(n)
        return old
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()

    def a():
        reference._blas_enter(setter)
        a_in.set()
        b_in.wait(5)
        reference._blas_exit(setter)           # B still inside: no restore
        a_out.set()

    def b():
        a_in.wait(5)
        reference._blas_enter(setter)
        b_in.set()
        a_out.wait(5)
        assert seen[-1] == 1
        reference._blas_exit(setter)
    ts = [threading.Thread(target=f) for f in (a, b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    assert calls == [1, 1, 3] and seen[-1] == 3
