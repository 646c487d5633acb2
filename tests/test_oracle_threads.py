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
    sets = [getattr(ctypes.CDLL(x), n, None) for x in libs
            for n in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads")]
    sets = [f for f in sets if f is not None]
    if not sets:
        pytest.skip("numpy's OpenBLAS exports no thread-count setter here (optional: the check needs one)")
    set_threads = sets[0]
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
    for blas in (4, 1):
        for min_work in (reference._THREAD_MIN_WORK, 0):          # in the calling thread, on the pool
            monkeypatch.setattr(reference, "_THREAD_MIN_WORK", min_work)
            set_threads(blas)
            out.append(run())
    set_threads(1)
    for o in out[1:]:
        assert all(np.array_equal(x, y) for x, y in zip(out[0], o))
