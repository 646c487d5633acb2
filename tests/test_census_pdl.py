"""census.pdl_waits: every backward kernel FA4 launches with PDL has griddepcontrol.wait in its PTX
(compile-only). The installed FA4 passes; the two planted dropped PDL waits of
fa4verify.races.RACE_MUTANTS, which no GPU run caught by timing, fail it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from fa4verify.compile.census_pdl import PdlRow, kernel_module, pdl_rows


def test_kernel_module_reads_fa4s_file_from_the_dump_name():
    assert kernel_module("cutlass___call___flash_attncuteflash_bwd_sm90FlashAttentionBackwardSm90_object_at_") \
        == "flash_bwd_sm90.py"
    assert kernel_module("cutlass___call___flash_attncuteflash_bwd_preprocessFlashAttentionBackwardPre") \
        == "flash_bwd_preprocess.py"
    assert kernel_module("cutlass__launch_Tensorgeneric") == ""


def test_a_pdl_kernel_without_a_wait_fails_and_a_non_pdl_kernel_needs_none():
    k = lambda name, ptx: SimpleNamespace(name=name, ptx=ptx)   # noqa: E731
    res = SimpleNamespace(case=SimpleNamespace(arch="sm_90a"), kernels=[
        k("x_flash_attncuteflash_bwd_preprocessFlashAttention", "griddepcontrol.launch_dependents;"),
        k("x_flash_attncuteflash_bwd_sm90FlashAttention", "griddepcontrol.wait;"),
        k("x_flash_attncuteflash_bwd_postprocessFlashAttention", ""),
        k("x_flash_attncuteflash_fwd_sm90FlashAttention", "")])
    rows = pdl_rows(res, {"flash_bwd_preprocess.py": True, "flash_bwd_sm90.py": True})
    by = {r.module: r for r in rows}
    assert set(by) == {"flash_bwd_preprocess.py", "flash_bwd_sm90.py", "flash_bwd_postprocess.py"}
    assert by["flash_bwd_preprocess.py"].status == "fail" and by["flash_bwd_sm90.py"].status == "pass"
    assert by["flash_bwd_postprocess.py"].status == "pass"          # not launched with PDL
    assert PdlRow("sm_90a", "k", "m.py", True, 2, 0).status == "pass"


def _audit(tmp_path, env=None) -> dict:
    rep = tmp_path / "pdl.json"
    cp = subprocess.run([sys.executable, "-m", "fa4verify", "audit", "--dtype", "bf16", "-k", "census.pdl_waits",
                         "--json", str(rep)], env=env, capture_output=True, text=True, timeout=900)
    assert rep.exists(), cp.stdout[-2000:] + cp.stderr[-2000:]
    return json.loads(rep.read_text())["results"][0]


@pytest.mark.fa4
@pytest.mark.slow
@pytest.mark.parametrize("mutant, module", [(None, None),
                                            ("bwd_preprocess_pdl_wait_dropped", "flash_bwd_preprocess.py"),
                                            ("bwd_sm90_lse_pdl_wait_dropped", "flash_bwd_sm90.py")])
def test_the_installed_fa4_passes_and_each_planted_pdl_wait_fails(tmp_path, mutant, module):
    from fa4verify import races
    env = dict(os.environ)
    if mutant:
        env.update(races.plant(mutant, tmp_path / "copy"))
    r = _audit(tmp_path, env)
    if mutant is None:
        assert r["status"] == "pass", r["summary"]
        assert r["metrics"]["pdl_kernels"] >= 3          # sm90 preprocess + main, sm100 preprocess (b36)
    else:
        assert r["status"] == "fail" and module in r["summary"], r["summary"]
