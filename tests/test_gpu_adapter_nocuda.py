"""Adapter behaviour that needs no GPU: clear NoCudaError, config record, emulation switch."""
from __future__ import annotations

import pytest

from fa4verify.kernels import adapter

needs_fa4 = pytest.mark.fa4  # skipped with the reason without flash-attn-4 (tests/conftest.py)


def test_every_entry_point_raises_no_cuda_error_without_a_gpu(no_cuda):
    ok, why = adapter.cuda_status()
    assert not ok
    import torch
    q = torch.zeros(1, 8, 1, 64, dtype=torch.bfloat16)
    for call in (lambda: adapter.forward(q, q, q),
                 lambda: adapter.backward(q, q, q, q, q, torch.zeros(1, 1, 8)),
                 lambda: adapter.forward_backward_autograd(q, q, q, q)):
        with pytest.raises(adapter.NoCudaError, match=r"^no CUDA device: "):
            call()
    assert why and isinstance(why, str)


def test_versions_are_json_strings():
    import json
    v = adapter.versions()
    json.dumps(v)
    for key in ("fa4", "dsl", "torch", "torch_cuda", "cuda_driver", "gpu", "python"):
        assert key in v


@needs_fa4
def test_compile_key_names_are_parsed_from_fa4_source():
    from flash_attn.cute import interface
    fwd = adapter._compile_key_names(interface._flash_attn_fwd)
    assert any({"tile_m", "tile_n", "pack_gqa", "use_2cta_instrs", "causal"} <= set(n) for n in fwd)
    bwd = adapter._compile_key_names(interface._flash_attn_bwd)
    assert any("deterministic" in n for n in bwd)


def test_segment_is_the_source_text_of_each_node():
    """The fast segment reader gives ``ast.get_source_segment``'s text for every node: one-line,
    multi-line, after non-ASCII text (column offsets count UTF-8 bytes), indented."""
    import ast
    src = ('def f(x):\n    # héllo — ß\n    compile_key = (x.shape, "é" + "ü", foo(\n        1, 2),\n'
           '        (a\n         , b), cutlass.const_expr(x))\n    return compile_key\n')
    lines = [ln.encode() for ln in src.splitlines(keepends=True)]
    nodes = [n for n in ast.walk(ast.parse(src)) if hasattr(n, "end_col_offset")]
    assert len(nodes) > 20
    for n in nodes:
        assert adapter._segment(lines, n) == ast.get_source_segment(src, n)


def test_key_names_of_a_method_after_a_form_feed_and_a_column_0_string(tmp_path, monkeypatch):
    """A form feed (a line break for ``str.splitlines``, not for the parser) and a method whose
    body holds a multi-line string at column 0 (no dedent parses it alone) both read right."""
    src = ('"""é"""\n\x0c\nclass K:\n    @staticmethod\n    def f(a, b):\n        doc = """x\ny\n"""\n'
           '        compile_key = (a.dtype, b,\n                       "ü" + doc)\n        return compile_key\n')
    (tmp_path / "keymod_fixture.py").write_text(src, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    mod = importlib.import_module("keymod_fixture")
    assert adapter._compile_key_names(mod.K.f) == [["a.dtype", "b", '"ü" + doc']]


@needs_fa4
def test_read_compile_key_names_fills_the_cache_for_every_entry_point():
    from flash_attn.cute import interface
    adapter._KEY_NAMES.clear()
    n = adapter.read_compile_key_names()
    assert n >= 3
    assert f"{interface._flash_attn_fwd.__module__}._flash_attn_fwd" in adapter._KEY_NAMES
    assert f"{interface._flash_attn_bwd.__module__}._flash_attn_bwd" in adapter._KEY_NAMES


@needs_fa4
def test_exp2_emulation_switch_sets_every_key_and_restores_the_table():
    import copy
    import flash_attn.cute.flash_fwd_sm100 as fwd100
    before = copy.deepcopy(fwd100._TUNING_CONFIG)
    with adapter.exp2_emulation_disabled():
        assert not adapter.exp2_emulation_enabled()
        assert all(v["ex2_emu_freq"] == 0 for v in fwd100._TUNING_CONFIG.values())
        assert (True, False, 128, False) in fwd100._TUNING_CONFIG
        # register split of present keys is kept
        assert fwd100._TUNING_CONFIG[(True, False, 128, False)]["num_regs_softmax"] == \
            before[(True, False, 128, False)]["num_regs_softmax"]
    assert adapter.exp2_emulation_enabled()
    assert fwd100._TUNING_CONFIG == before


def test_call_config_to_dict_is_flat_json():
    import json
    c = adapter.CallConfig(op="forward", entry="flash_attn_func", versions={"fa4": "x"}, arch=90,
                           gpu_name=None, dtype="bfloat16", q_shape=(1, 2, 3, 4), k_shape=(1, 2, 3, 4),
                           v_shape=(1, 2, 3, 4), softmax_scale=0.5, causal=False, window_size=(None, None),
                           softcap=0.0, learnable_sink=False, pack_gqa_requested=None, varlen=False,
                           deterministic=False, return_lse=True, tuning_key=(True, False, 128, False))
    d = json.loads(json.dumps(c.to_dict()))
    assert d["q_shape"] == [1, 2, 3, 4] and d["tuning_key"] == [True, False, 128, False]


@needs_fa4
def test_adapter_window_resolution_matches_fa4_interface():
    """The (causal, local) the adapter records (``facts.resolve_causal_local_window``) follows FA4's
    own ``_resolve_causal_local_window``: only a both-negative window is dropped, and the check
    comes before ``causal``."""
    from flash_attn.cute import interface

    from fa4verify.kernels.facts import resolve_causal_local_window
    sides = (None, -2, -1, 0, 1, 5)
    for causal in (False, True):
        for left in sides:
            for right in sides:
                c, loc, _, _ = interface._resolve_causal_local_window(causal, left, right)
                assert resolve_causal_local_window(causal, (left, right))[:2] == (c, loc), (causal, left, right)
