"""``fa4verify sass`` command line: usage errors exit 2 without a traceback; a compile gives
a census (compile-only)."""
from __future__ import annotations

import json

import pytest

from fa4verify.cli import main


@pytest.mark.parametrize("argv", [
    ["sass", "--arch", "sm_100a", "--head-dim", "160"],
    ["sass", "--arch", "sm_90a", "--head-dim", "260"],
    ["sass", "--arch", "sm_90a", "--head-dim", "100"],
    ["sass", "--arch", "sm_80", "--head-dim", "128"],
    ["sass", "--head-dim", "128"],
])
def test_sass_cli_rejects_bad_input_with_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip()


@pytest.mark.fa4
@pytest.mark.slow  # one FA4 compile
def test_sass_cli_sm90_hd64_writes_json_census(tmp_path, capsys):
    out = tmp_path / "c.json"
    rc = main(["sass", "--arch", "sm_90a", "--head-dim", "64", "--causal", "--seqlen", "256",
               "--json", str(out), "--keep-dir", str(tmp_path / "dump")])
    assert rc == 0
    cen = json.loads(out.read_text())
    assert cen["forward_config"]["arch"] == 90
    k = cen["kernels"][cen["forward_kernel"]]
    assert k["sass"]["MUFU.EX2"] == k["ptx"]["ex2.approx.ftz.f32"] > 0
    assert "compile-only" in capsys.readouterr().out
