"""``fa4verify determinism`` as a user runs it: exit codes, errors, manifest round trip."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from fa4verify.cli.determinism import command

CPU = ["--backend", "torch-math", "--configs", "mha-hd64-full,mha-hd64-sink", "--runs", "2",
       "--processes", "1", "--default-runs", "1"]
CPU2 = CPU[:-4] + ["--processes", "2", "--default-runs", "2"]


def _run(args):
    return CliRunner().invoke(command, args)


def test_fa4_backend_without_gpu_exits_2_with_the_reason(no_cuda):
    r = _run(["--runs", "1", "--processes", "1", "--configs", "mha-hd64-full-edge"])
    assert r.exit_code == 2, r.output
    assert "no CUDA device" in r.output or "adapter" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args,needle", [
    (["--runs", "0"], "--runs"),
    (["--processes", "0"], "--processes"),
    (["--configs", "no-such-config"], "no-such-config"),
    (["--strict-env"], "--strict-env needs --against"),
    (["--backend", "nonsense"], "nonsense"),
    (["--backend", "torch-math", "--devices", "1"], "--devices"),
    (["--default-runs", "-1"], "--default-runs"),
])
def test_bad_input_is_a_one_line_usage_error(args, needle):
    r = _run(args)
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


def test_against_an_unreadable_manifest_is_a_usage_error(tmp_path):
    p = tmp_path / "m.json"
    p.write_text("[]")
    r = _run(CPU + ["--against", str(p)])
    assert r.exit_code == 2 and "not a determinism manifest" in r.output


def test_list_configs_prints_keys():
    r = _run(["--backend", "torch-math", "--configs", "cpu", "--list-configs"])
    assert r.exit_code == 0
    assert "mha-hd64-varlen" in r.output and "seed4" in r.output


@pytest.mark.slow  # five runs of the command, each in fresh processes
def test_manifest_round_trip_match_mismatch_and_env_differs(tmp_path):
    man, rep = tmp_path / "m.json", tmp_path / "r.json"
    r = _run(CPU2 + ["--manifest", str(man), "--json", str(rep)])
    assert r.exit_code == 0, r.output
    report = json.loads(rep.read_text())
    assert [c["status"] for c in report["configs"]] == ["reproducible", "reproducible"]
    assert all(c["total_runs"] == 4 for c in report["configs"])
    m = json.loads(man.read_text())
    assert len(m["entries"]) == 2 and m["environment_key"]["backend"] == "torch-math"
    key = next(k for k in m["entries"] if k.startswith("mha-hd64-sink"))
    assert set(m["entries"][key]["digests"]) == {"dq", "dk", "dv", "dsink"}

    r = _run(CPU + ["--against", str(man)])
    assert r.exit_code == 0 and "manifest comparison: match" in r.output, r.output

    m2 = json.loads(man.read_text())
    m2["entries"][key]["digests"]["dk"] = "0" * 64
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(m2))
    r = _run(CPU + ["--against", str(bad)])
    assert r.exit_code == 1, r.output
    assert "mismatch" in r.output and "tensors=['dk']" in r.output

    m2["environment_key"]["torch"] = "0.0.1"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(m2))
    r = _run(CPU + ["--against", str(other)])
    assert r.exit_code == 0, r.output
    assert "different-environment" in r.output and "environment differs" in r.output
    r = _run(CPU + ["--against", str(other), "--strict-env"])
    assert r.exit_code == 1, r.output
