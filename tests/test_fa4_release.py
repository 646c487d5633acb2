"""Auditing any FA4 release (docs/howto.md, "Audit an older FA4 release"): the report names the
release, a stack the release's metadata does not accept is said in one line, and the release's
own rules (window rule, supported head dims, keyword arguments) are read from the installed
source, not assumed. CPU only; the older release's rule is FA4 4.0.0b25's text, quoted."""
from __future__ import annotations

import io
import json

import pytest

from fa4verify.audit import environment
from fa4verify.kernels import facts, fa4_params

B25_REQUIRES = ["nvidia-cutlass-dsl==4.6.0.dev0", "torch", "apache-tvm-ffi<0.2,>=0.1.12", "torch-c-dlpack-ext",
                "quack-kernels>=0.5.3", 'nvidia-cutlass-dsl[cu13]==4.6.0.dev0; extra == "cu13"']


def test_a_mismatched_stack_is_said_in_one_line():
    st = environment.fa4_stack(B25_REQUIRES, {"nvidia-cutlass-dsl": "4.8.1", "quack-kernels": "0.6.5"})
    assert st["requires"] == {"nvidia-cutlass-dsl": "==4.6.0.dev0", "quack-kernels": ">=0.5.3"}
    assert st["mismatch"] == [f"nvidia-cutlass-dsl 4.8.1 installed; flash-attn-4 {st['release']} requires "
                              "nvidia-cutlass-dsl==4.6.0.dev0"]
    line = environment.stack_line(st)
    assert "\n" not in line and "MISMATCHED STACK" in line and "4.6.0.dev0" in line


def test_the_stack_its_metadata_names_matches():
    st = environment.fa4_stack(B25_REQUIRES, {"nvidia-cutlass-dsl": "4.6.0.dev0", "quack-kernels": "0.5.3"})
    assert st["mismatch"] == [] and "stack matches its metadata" in environment.stack_line(st)
    st = environment.fa4_stack(B25_REQUIRES, {"nvidia-cutlass-dsl": "4.6.0.dev0", "quack-kernels": None})
    assert st["mismatch"] == [f"quack-kernels not installed; flash-attn-4 {st['release']} requires "
                              "quack-kernels>=0.5.3"]


def test_the_report_names_the_release_in_the_terminal_and_the_json(tmp_path):
    from rich.console import Console

    from fa4verify.audit.report_json import build_report
    from fa4verify.audit.terminal import render_verdict
    env = {"versions": {"FA4": "4.0.0b25"},
           "stack": environment.fa4_stack(B25_REQUIRES, {"nvidia-cutlass-dsl": "4.8.1", "quack-kernels": "0.6.5"})}
    env["stack"]["release"] = "4.0.0b25"
    rep = build_report(config={"profile": "default"}, environment=env, results=[], exit_code=0, duration_s=0.1)
    buf = io.StringIO()
    render_verdict(rep, Console(file=buf, width=300))
    out = buf.getvalue()
    assert "FA4 release: flash-attn-4 4.0.0b25" in out and "MISMATCHED STACK" in out
    js = json.loads(json.dumps(rep))
    assert js["environment"]["versions"]["FA4"] == "4.0.0b25"
    assert js["environment"]["stack"]["mismatch"]


def test_collect_records_the_installed_stack():
    env = environment.collect("cpu")
    st = env["stack"]
    assert st["release"] == env["versions"]["FA4"]
    assert set(st["installed"]) == set(environment.STACK)


# ----------------------------------------------------------------------- rules read from the release
B25_WINDOW_RULE = '''
def _resolve_causal_local_window(causal, window_size_left, window_size_right, mask_mod=None):
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
'''


def test_the_window_rule_is_the_installed_releases(monkeypatch):
    ns: dict = {}
    exec(B25_WINDOW_RULE, ns)
    b25 = ns["_resolve_causal_local_window"]
    monkeypatch.setattr(fa4_params, "installed_rule",
                        lambda name: b25 if name == "_resolve_causal_local_window" else None)
    # causal with left = -1: 4.0.0b25 drops the window (sum < 0) -> plain causal
    assert facts.resolve_causal_local_window(True, (-1, None)) == (True, False, None, None)
    # (-3, 2): dropped by 4.0.0b25 (sum < 0), kept by 4.0.0b30+ (not both negative)
    assert facts.resolve_causal_local_window(False, (-3, 2)) == (False, False, None, None)
    monkeypatch.setattr(fa4_params, "installed_rule", lambda name: None)   # the pinned 4.0.0b36 rule
    assert facts.resolve_causal_local_window(True, (-1, None)) == (False, True, -1, 0)
    assert facts.resolve_causal_local_window(False, (-3, 2)) == (False, True, -3, 2)


@pytest.mark.fa4
def test_the_pinned_rules_equal_the_installed_releases():
    """With FA4 installed the facts run its own rules; the pinned copies (FA4 absent) must agree
    with the installed 4.0.0b36 on a grid."""
    win = fa4_params.installed_rule("_resolve_causal_local_window")
    hd = fa4_params.installed_rule("_validate_head_dims")
    assert win is not None and hd is not None
    import unittest.mock as mock
    sides = (None, -3, -1, 0, 1, 5)
    grid_w = [(c, (l, r)) for c in (False, True) for l in sides for r in sides]
    grid_h = [(a, h, hv, dt) for a in ("sm90", "sm100") for h in range(0, 600, 8) for hv in (64, 128, 256, 512, h)
              for dt in ("bf16", "fp8")]
    live_w = [facts.resolve_causal_local_window(c, w) for c, w in grid_w]
    live_h = [facts.head_dims_supported(*g) for g in grid_h]
    with mock.patch.object(fa4_params, "installed_rule", lambda name: None):
        assert [facts.resolve_causal_local_window(c, w) for c, w in grid_w] == live_w
        assert [facts.head_dims_supported(*g) for g in grid_h] == live_h


def test_supported_head_dims_follow_the_installed_rule(monkeypatch):
    """A release whose rule accepts only head dim 64 makes facts say so (read, not assumed)."""
    def only_64(head_dim, head_dim_v, compute_capability, alignment):
        assert head_dim == head_dim_v == 64
    monkeypatch.setattr(fa4_params, "installed_rule", lambda name: only_64 if name == "_validate_head_dims" else None)
    assert facts.head_dims_supported("sm90", 64, 64) and not facts.head_dims_supported("sm90", 128, 128)


def test_quack_s_own_pin_on_the_dsl_is_checked():
    """4.0.0b25's stack is DSL 4.6.0.dev0 with quack-kernels 0.5.3: quack 0.6.5 wants DSL >= 4.7."""
    inst = {"nvidia-cutlass-dsl": "4.6.0.dev0", "quack-kernels": "0.6.5"}
    st = environment.fa4_stack({"flash-attn-4": B25_REQUIRES, "quack-kernels": ["nvidia-cutlass-dsl>=4.7", "torch"]},
                               inst)
    assert st["mismatch"] == ["nvidia-cutlass-dsl 4.6.0.dev0 installed; quack-kernels 0.6.5 requires "
                              "nvidia-cutlass-dsl>=4.7"]
    inst["quack-kernels"] = "0.5.3"
    st = environment.fa4_stack({"flash-attn-4": B25_REQUIRES, "quack-kernels": ["nvidia-cutlass-dsl==4.6.0.dev0"]},
                               inst)
    assert st["mismatch"] == []
