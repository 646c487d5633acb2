"""Note [The oracle's window is the release's]: the oracle judges a windowed problem with the
window rule of the installed FA4 release, as the twin, the budgets and the keep-masks do. Under
the rule of 4.0.0b20..b29 (``causal`` first, a window whose sides sum below zero dropped) the
twin's forward of a ``window=(-98, 53)`` problem (fuzz.twin's shrunk example on those releases)
is full attention, and so must the oracle's truth be; under b30's rule it is a window."""
from __future__ import annotations

import pytest

from fa4verify.judge.attention import oracle_window
from fa4verify.kernels import fa4_params
from fa4verify.problem import AttentionProblem, ValueSpec


def _rule_b29(causal, window_size_left, window_size_right, mask_mod=None):
    """FA4 4.0.0b29's _resolve_causal_local_window (interface.py), as released."""
    if mask_mod is not None:
        return False, False, window_size_left, window_size_right
    if causal:
        window_size_right = 0
    if window_size_left is not None and window_size_right is not None and window_size_left + window_size_right < 0:
        window_size_left = None
        window_size_right = None
    if window_size_left is not None or window_size_right is not None:
        if window_size_left is None and window_size_right == 0:
            causal, local = True, False
            window_size_right = None
        else:
            causal, local = False, True
    else:
        local = False
    return causal, local, window_size_left, window_size_right


def _rule_b30(causal, window_size_left, window_size_right, mask_mod=None):
    """FA4 4.0.0b30..b36's rule."""
    if mask_mod is not None:
        return False, False, window_size_left, window_size_right
    if (window_size_left is not None and window_size_right is not None
            and window_size_left < 0 and window_size_right < 0):
        window_size_left = None
        window_size_right = None
    if causal:
        window_size_right = 0
    if window_size_left is not None or window_size_right is not None:
        if window_size_left is None and window_size_right == 0:
            causal, local = True, False
            window_size_right = None
        else:
            causal, local = False, True
    else:
        local = False
    return causal, local, window_size_left, window_size_right


@pytest.fixture(params=["b29", "b30"])
def rule(request, monkeypatch):
    r = {"b29": _rule_b29, "b30": _rule_b30}[request.param]
    monkeypatch.setattr(fa4_params, "installed_rule",
                        lambda name: r if name == "_resolve_causal_local_window" else None)
    return request.param


def _problem(window, causal=False):
    return AttentionProblem(arch="sm90", dtype="bf16", batch=2, seqlen_q=113, seqlen_k=80, nheads=2, nheads_kv=1,
                            head_dim=8, head_dim_v=8, causal=causal, window_size=window,
                            values=ValueSpec("outliers", 20960315))


def test_oracle_window_follows_the_installed_rule(rule):
    old = rule == "b29"
    assert oracle_window(_problem((-98, 53))) == ((False, (None, None)) if old else (False, (-98, 53)))
    assert oracle_window(_problem((-5, -3))) == (False, (None, None))
    assert oracle_window(_problem((None, None), causal=True)) == (True, (None, None))
    assert oracle_window(_problem((7, None), causal=True)) == (False, (7, 0))
    # causal with a left side that empties the window: b29 drops it (sum < 0), b30 keeps it empty
    assert oracle_window(_problem((-1, None), causal=True)) == ((True, (None, None)) if old else (False, (-1, 0)))


@pytest.mark.fa4
def test_twin_forward_within_budget_under_each_rule(rule):
    """The twin follows the rule; the oracle must too (before the fix: fwd_budget violated under b29)."""
    pytest.importorskip("torch")
    from fa4verify.fuzz.properties import check_problem
    from fa4verify.targets import TwinTarget
    check_problem(_problem((-98, 53)), TwinTarget(), properties=("fwd_budget",), backward=False)
