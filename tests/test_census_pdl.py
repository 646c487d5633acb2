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


def _audit(tmp_path, env=None, cache=None) -> dict:
    rep = tmp_path / "pdl.json"
    cp = subprocess.run([sys.executable, "-m", "fa4verify", "audit", "--dtype", "bf16", "-k", "census.pdl_waits",
                         "--json", str(rep), "--kernel-cache", str(cache) if cache else "off"],
                        env=env, capture_output=True, text=True, timeout=900)
    assert rep.exists(), cp.stdout[-2000:] + cp.stderr[-2000:]
    return json.loads(rep.read_text())["results"][0]


@pytest.mark.fa4
@pytest.mark.slow
@pytest.mark.parametrize("mutant, module", [(None, None),
                                            ("bwd_preprocess_pdl_wait_dropped", "flash_bwd_preprocess.py"),
                                            ("bwd_sm90_lse_pdl_wait_dropped", "flash_bwd_sm90.py")])
def test_the_installed_fa4_passes_and_each_planted_pdl_wait_fails(tmp_path, mutant, module):
    from fa4verify import races
    from fa4verify.compile import census_pdl
    cache = tmp_path / "kcache"           # the audit's --kernel-cache (Note [Census cache])
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASH_ATTENTION_CUTE_DSL_CACHE")}
    if mutant:
        # the cache holds a passing census of the installed (unplanted) FA4: the planted copy's
        # own source digest must not read it (Note [Census cache])
        for arch in ("sm_90a", "sm_100a"):
            census_pdl.cached_rows(arch, str(cache), lambda a=arch: [
                census_pdl.PdlRow(a, "k", m, True, 1, 0) for m in ("flash_bwd_preprocess.py", "flash_bwd_sm90.py")],
                {})
        env.update(races.plant(mutant, tmp_path / "copy"))
    r = _audit(tmp_path, env, cache)
    assert r["metrics"]["archs_from_cache"] == 0
    if mutant is None:
        assert r["status"] == "pass", r["summary"]
        assert r["metrics"]["pdl_kernels"] >= 3          # sm90 preprocess + main, sm100 preprocess (b36)
        again = _audit(tmp_path, env, cache)             # the same FA4, DSL and driver: read back
        assert again["metrics"]["archs_from_cache"] == 2
        assert (again["status"], again["summary"], again["details"]["table"]) == \
            (r["status"], r["summary"], r["details"]["table"])
    else:
        assert r["status"] == "fail" and module in r["summary"], r["summary"]


# ---------------------------------------------------------------- Note [Census cache]

def test_census_cache_compiles_once_and_rereads_pdl_from_the_source(tmp_path, monkeypatch):
    from fa4verify.compile import census_pdl
    monkeypatch.setattr(census_pdl, "census_key", lambda arch: f"k-{arch}")
    calls = []

    def compile_rows():
        calls.append(1)
        return [PdlRow("sm_90a", "kpre", "flash_bwd_preprocess.py", True, 1, 0),
                PdlRow("sm_90a", "kmain", "flash_bwd_sm90.py", True, 0, 0)]

    files = {"flash_bwd_preprocess.py": True, "flash_bwd_sm90.py": True}
    rows, hit = census_pdl.cached_rows("sm_90a", str(tmp_path), compile_rows, files)
    assert not hit and len(calls) == 1 and [r.status for r in rows] == ["pass", "fail"]
    rows2, hit2 = census_pdl.cached_rows("sm_90a", str(tmp_path), compile_rows, files)
    assert hit2 and len(calls) == 1
    assert [(r.module, r.waits, r.triggers, r.status) for r in rows2] == \
        [(r.module, r.waits, r.triggers, r.status) for r in rows]
    # whether a kernel launches with PDL comes from this run's source, not from the entry
    rows3, _ = census_pdl.cached_rows("sm_90a", str(tmp_path), compile_rows, {"flash_bwd_preprocess.py": True})
    assert [r.status for r in rows3] == ["pass", "pass"] and not rows3[1].pdl
    # another arch is another entry; no cache directory: always compiled
    census_pdl.cached_rows("sm_100a", str(tmp_path), compile_rows, files)
    census_pdl.cached_rows("sm_90a", None, compile_rows, files)
    assert len(calls) == 3


def test_census_cache_entry_that_is_unreadable_is_compiled_again(tmp_path, monkeypatch):
    from fa4verify.compile import census_pdl
    monkeypatch.setattr(census_pdl, "census_key", lambda arch: "k")
    calls = []
    rows = lambda: calls.append(1) or [PdlRow("sm_90a", "k", "flash_bwd_sm90.py", True, 1, 0)]   # noqa: E731
    census_pdl.cached_rows("sm_90a", str(tmp_path), rows, {})
    (entry,) = (tmp_path / "fa4verify-census").iterdir()
    entry.write_text("{not json")
    _, hit = census_pdl.cached_rows("sm_90a", str(tmp_path), rows, {})
    assert not hit and len(calls) == 2
    _, hit = census_pdl.cached_rows("sm_90a", str(tmp_path), rows, {})
    assert hit and len(calls) == 2                       # rewritten by the second compile


def test_census_key_follows_every_fa4_source_file_and_the_arch(tmp_path, monkeypatch):
    from fa4verify.compile import census_pdl
    from fa4verify.kernels import fa4_params
    src = tmp_path / "cute"
    (src / "sub").mkdir(parents=True)
    (src / "flash_bwd_sm90.py").write_text("use_pdl=True\ncute.arch.griddepcontrol_wait()\n")
    (src / "sub" / "helper.py").write_text("x = 1\n")
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: src)
    k0 = census_pdl.census_key("sm_90a")
    assert k0 == census_pdl.census_key("sm_90a") and k0 != census_pdl.census_key("sm_100a")
    (src / "sub" / "helper.py").write_text("x = 2\n")          # any file of the package, not only bwd
    k1 = census_pdl.census_key("sm_90a")
    (src / "flash_bwd_sm90.py").write_text("use_pdl=True\n")  # the planted dropped wait
    assert len({k0, k1, census_pdl.census_key("sm_90a")}) == 3
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: None)
    assert census_pdl.census_key("sm_90a") is None


def test_census_key_follows_fa4_switches_in_the_environment(tmp_path, monkeypatch):
    from fa4verify.compile import census_pdl
    from fa4verify.kernels import fa4_params
    src = tmp_path / "cute"
    src.mkdir()
    (src / "interface.py").write_text("x = 1\n")
    monkeypatch.setattr(fa4_params, "fa4_source_dir", lambda: src)
    monkeypatch.delenv("FLASH_ATTENTION_BWD_TILE_N", raising=False)
    k0 = census_pdl.census_key("sm_90a")
    monkeypatch.setenv("FLASH_ATTENTION_BWD_TILE_N", "64")     # an FA4 tile override changes the build
    assert census_pdl.census_key("sm_90a") != k0
