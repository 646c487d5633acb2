"""One process per GPU (fa4verify.run.gpus): which GPUs, the pinning of each process, the
cross-GPU determinism verdict, and the audit spread over GPUs -- on the CPU, with fake GPUs
(``FA4VERIFY_FAKE_GPUS=N``) running the twin in spawned processes."""
from __future__ import annotations

import json
import os
import sys
import types
import xml.etree.ElementTree as ET

import pytest

from fa4verify.run import gpus as mg
from fa4verify.run.gpus import Gpu

FIX = os.path.join(os.path.dirname(__file__), "fixtures")
PHYS = [("0", "NVIDIA H200", "GPU-aaaa0000-0000"), ("1", "NVIDIA H200", "GPU-bbbb1111-1111"),
        ("2", "NVIDIA H200", "GPU-cccc2222-2222"), ("3", "NVIDIA H100", "GPU-dddd3333-3333")]
U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"     # full-length UUIDs (nvidia-smi's form)
U1 = "GPU-bbbbbbbb-1111-1111-1111-111111111111"


def _gpus(env):
    return mg.visible_gpus(env, query=lambda: PHYS)


# ------------------------------------------------------------------------------ GPU listing, pinning
def test_without_cuda_visible_devices_every_gpu_is_listed_and_pinned_by_uuid():
    g = _gpus({})
    assert [x.index for x in g] == [0, 1, 2, 3]
    assert [x.visible for x in g] == [p[2] for p in PHYS]
    assert g[3].name == "NVIDIA H100" and g[3].label() == "GPU 3 (NVIDIA H100, GPU-dddd3333-3333)"


@pytest.mark.parametrize("cvd,want_uuids", [
    ("2,0", ["GPU-cccc2222-2222", "GPU-aaaa0000-0000"]),          # indices, parent's order
    ("GPU-dddd,GPU-bbbb1111-1111", ["GPU-dddd3333-3333", "GPU-bbbb1111-1111"]),  # UUID prefixes
    ("1,-1,2", ["GPU-bbbb1111-1111"]),                             # CUDA stops at an invalid entry
    ("", []),
])
def test_parent_cuda_visible_devices_list_maps_to_one_distinct_gpu_per_child(cvd, want_uuids):
    gs = _gpus({"CUDA_VISIBLE_DEVICES": cvd})
    assert [g.uuid for g in gs] == want_uuids
    assert [g.index for g in gs] == list(range(len(want_uuids)))   # the parent's numbering
    envs = [mg.child_env(g, {"CUDA_VISIBLE_DEVICES": cvd}) for g in gs]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == want_uuids   # one GPU per child, all distinct
    assert all(e["FA4VERIFY_PIN_GPU"] == "0" and e["FA4VERIFY_PARENT_CUDA_VISIBLE_DEVICES"] == cvd
               for e in envs)
    assert [e["FA4VERIFY_GPU_INDEX"] for e in envs] == [str(i) for i in range(len(gs))]


def test_an_entry_nvidia_smi_does_not_know_is_kept_as_given():
    gs = mg.visible_gpus({"CUDA_VISIBLE_DEVICES": "MIG-1234,5"}, query=lambda: [])
    assert [(g.visible, g.name) for g in gs] == [("MIG-1234", "unknown"), ("5", "unknown")]


def test_n_workers_over_the_parent_list_each_get_their_own_gpu():
    gs = mg.select_gpus("3", _gpus({"CUDA_VISIBLE_DEVICES": "3,2,1,0"}))
    assert [mg.child_env(g)["CUDA_VISIBLE_DEVICES"] for g in gs] == \
        ["GPU-dddd3333-3333", "GPU-cccc2222-2222", "GPU-bbbb1111-1111"]


@pytest.mark.parametrize("spec,want", [("all", [0, 1, 2, 3]), ("2", [0, 1]), ("0,1,3", [0, 1, 3]),
                                       ("3,", [3]), ("ALL", [0, 1, 2, 3]), (" 1,2 ", [1, 2])])
def test_select_gpus_all_count_and_indices(spec, want):
    assert [g.index for g in mg.select_gpus(spec, _gpus({}))] == want


@pytest.mark.parametrize("spec,needle", [("0", "asks for 0"), ("5", "asks for 5"), ("0,4", "GPU 4 does not exist"),
                                         ("1,1", "twice"), ("x", "expected 'all'"), ("", "expected 'all'"),
                                         ("-1", "expected 'all'")])
def test_select_gpus_refuses_bad_specs_in_one_line(spec, needle):
    with pytest.raises(ValueError) as e:
        mg.select_gpus(spec, _gpus({}))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_no_gpu_visible_says_so_and_names_the_test_mode():
    with pytest.raises(ValueError, match="no GPU visible.*FA4VERIFY_FAKE_GPUS"):
        mg.select_gpus("all", mg.visible_gpus({}, query=lambda: [], count=lambda: 0))


def test_without_nvidia_smi_torchs_device_count_gives_indices():
    gs = mg.visible_gpus({}, query=lambda: [], count=lambda: 2)
    assert [(g.index, g.visible, g.name) for g in gs] == [(0, "0", "unknown"), (1, "1", "unknown")]


def test_fake_mode_lists_fake_gpus_and_rejects_bad_counts():
    gs = mg.visible_gpus({mg.ENV_FAKE: "2"}, query=lambda: PHYS)
    assert [(g.name, g.uuid, g.fake) for g in gs] == [("Fake GPU 0", "GPU-fake-00000000", True),
                                                      ("Fake GPU 1", "GPU-fake-00000001", True)]
    for bad in ("0", "two"):
        with pytest.raises(ValueError, match=mg.ENV_FAKE):
            mg.visible_gpus({mg.ENV_FAKE: bad})
    assert mg.fake_set(mg.ENV_FAKE_FAULT, {mg.ENV_FAKE_FAULT: "1"}) == set()   # only in fake mode
    assert mg.fake_set(mg.ENV_FAKE_FAULT, {mg.ENV_FAKE: "2", mg.ENV_FAKE_FAULT: "0,1"}) == {0, 1}


# ------------------------------------------------------------------------------ cross-GPU verdict
def _rec(gpu, proc, digests_by_cfg, names=("c1", "c2")):
    res = []
    for k in names:
        if k not in digests_by_cfg:
            continue
        res.append({"config": k, "name": k, "status": "ok", "device": f"fake:{gpu}",
                    "inputs_digest": "in", "fwd_digests": {},
                    "det": {"runs": 2, "digests": {t: {d: {"count": 2, "first_run": 0}}
                                                   for t, d in digests_by_cfg[k].items()},
                            "guard_violations": [], "unwritten": []}})
    return {"results": res, "gpu": Gpu(gpu, str(gpu), f"Fake GPU {gpu}", f"GPU-fake-{gpu}",
                                       True).to_json(), "gpu_process": proc, "process_index": gpu}


def _cross(records, n):
    from fa4verify.determinism import multi
    from fa4verify.determinism.report import aggregate

    cfgs = [types.SimpleNamespace(key=lambda k=k: k, name=k, attention="mha", mask="full",
                                  to_json=lambda: {}, xfail_reason=lambda a: None)
            for k in ("c1", "c2")]
    rep = aggregate(records, cfgs)
    gpus = [Gpu(i, str(i), f"Fake GPU {i}", f"GPU-fake-{i}", True) for i in range(n)]
    return rep, multi.cross_gpu(rep, records, gpus, 1)


def test_equal_digests_on_every_gpu_pass_the_cross_gpu_claim():
    same = {"c1": {"dq": "a", "dk": "b"}, "c2": {"dq": "c", "dk": "d"}}
    rep, s = _cross([_rec(0, 0, same), _rec(1, 0, same)], 2)
    assert s["status"] == "pass" and s["configs_compared"] == 2
    assert [c["status"] for c in rep["configs"]] == ["reproducible", "reproducible"]
    assert rep["configs"][0]["per_gpu_digests"] == {"0": {"dq": "a", "dk": "b"}, "1": {"dq": "a", "dk": "b"}}


def test_a_gpu_with_other_digests_fails_naming_the_gpu_configuration_and_tensor():
    a = {"c1": {"dq": "a", "dk": "b"}, "c2": {"dq": "c", "dk": "d"}}
    b = {"c1": {"dq": "a", "dk": "B"}, "c2": {"dq": "c", "dk": "d"}}
    rep, s = _cross([_rec(0, 0, a), _rec(1, 0, b)], 2)
    assert s["status"] == "fail"
    assert s["mismatches"] == ["c1 (c1): digests differ across GPUs: GPU 1 (Fake GPU 1, GPU-fake-1) "
                               "differs from GPU 0 (Fake GPU 0, GPU-fake-0) in dk"]
    assert [c["status"] for c in rep["configs"]] == ["not-reproducible", "reproducible"]


def test_a_configuration_missing_on_one_gpu_is_an_error_never_reproducible():
    full = {"c1": {"dq": "a"}, "c2": {"dq": "c"}}
    died = _rec(1, 0, {"c1": {"dq": "a"}})
    died["fatal"] = "GPU 1 (Fake GPU 1, GPU-fake-1) process 0 killed by SIGABRT (exit -6)"
    rep, s = _cross([_rec(0, 0, full), died], 2)
    assert s["status"] == "error"
    assert [c["status"] for c in rep["configs"]] == ["reproducible", "error"]
    assert "no result from GPU 1 (Fake GPU 1, GPU-fake-1) process 0" in rep["configs"][1]["reason"]
    assert any("SIGABRT" in e for e in s["errors"])


def test_a_configuration_the_time_budget_cut_on_one_gpu_leaves_the_claim_undecided():
    full = {"c1": {"dq": "a"}, "c2": {"dq": "c"}}
    cut = _rec(1, 0, {"c1": {"dq": "a"}})
    cut["results"].append({"config": "c2", "name": "c2", "device": "fake:1", "status": "not-run",
                           "reason": "time budget exhausted before this configuration"})
    rep, s = _cross([_rec(0, 0, full), cut], 2)
    assert s["status"] == "undecided" and s["configs_compared"] == 1
    assert [c["status"] for c in rep["configs"]] == ["reproducible", "not-run"]
    assert "not run on GPU 1 (Fake GPU 1, GPU-fake-1) process 0" in rep["configs"][1]["reason"]


def test_one_gpu_judges_reproducibility_but_leaves_the_cross_gpu_claim_not_tested():
    rep, s = _cross([_rec(0, 0, {"c1": {"dq": "a"}, "c2": {"dq": "c"}})], 1)
    assert s["status"] == "not-tested"
    assert "1 GPU: cross-GPU agreement not tested" in s["evidence"]
    assert [c["status"] for c in rep["configs"]] == ["reproducible", "reproducible"]


# ------------------------------------------------------------------------------ spawned fake GPUs
TWIN = ["--backend", "twin", "--configs", "mha-hd64-full,gqa-hd64-causal", "--runs", "2",
        "--processes", "1", "--no-default-mode"]


def _det(args, monkeypatch, **env):
    pytest.importorskip("torch")
    from click.testing import CliRunner

    from fa4verify.cli.determinism import command
    for k in (mg.ENV_FAKE, mg.ENV_FAKE_FAULT, mg.ENV_FAKE_CRASH):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return CliRunner().invoke(command, args)


@pytest.mark.slow   # spawns fresh processes (torch import each)
def test_two_fake_gpus_with_equal_digests_pass_and_the_manifest_lists_both(tmp_path, monkeypatch):
    man = tmp_path / "m.json"
    r = _det(TWIN + ["--gpus", "all", "--manifest", str(man)], monkeypatch, FA4VERIFY_FAKE_GPUS="2")
    assert r.exit_code == 0, r.output
    assert "cross-GPU: pass" in r.output and "Traceback" not in r.output
    m = json.loads(man.read_text())
    assert [g["name"] for g in m["gpus"]] == ["Fake GPU 0", "Fake GPU 1"]
    assert m["cross_gpu"]["status"] == "pass" and len(m["entries"]) == 2
    # the spawned twin computes what the twin computes in this process
    from fa4verify import determinism as d
    cfg = d.select_configs(["gqa-hd64-causal"])[0]
    here = d.run_config(d.load_backend("twin"), cfg, "cpu", runs=1)
    want = {t: next(iter(v)) for t, v in here["det"]["digests"].items()}
    per = m["per_gpu_digests"][cfg.key()]
    assert per == {"0": want, "1": want}


@pytest.mark.slow
def test_a_planted_per_gpu_difference_fails_naming_that_gpu(monkeypatch):
    r = _det(TWIN + ["--gpus", "2"], monkeypatch, FA4VERIFY_FAKE_GPUS="2", FA4VERIFY_FAKE_GPU_FAULT="1")
    assert r.exit_code == 1, r.output
    assert "cross-GPU: fail" in r.output
    assert "GPU 1 (Fake GPU 1, GPU-fake-00000001) differs from GPU 0 (Fake GPU 0, GPU-fake-00000000)" in r.output
    assert "mha-hd64-full" in r.output and "reproducible " not in r.output.replace("not-reproducible", "")


@pytest.mark.slow
def test_a_crashed_gpu_process_is_an_error_not_a_pass(monkeypatch):
    r = _det(TWIN + ["--gpus", "all"], monkeypatch, FA4VERIFY_FAKE_GPUS="2", FA4VERIFY_FAKE_GPU_CRASH="1")
    assert r.exit_code == 3, r.output
    assert "cross-GPU: error" in r.output and "SIGABRT" in r.output
    assert "cross-GPU: pass" not in r.output
    assert "error             gqa-hd64-causal" in r.output   # the configuration GPU 1 never ran


@pytest.mark.slow
def test_one_gpu_runs_one_process_and_says_cross_gpu_not_tested(monkeypatch):
    r = _det(TWIN[:4] + ["--runs", "2", "--processes", "1", "--no-default-mode", "--gpus", "all"],
             monkeypatch, FA4VERIFY_FAKE_GPUS="1")
    assert r.exit_code == 0, r.output
    assert "cross-GPU: not-tested" in r.output and "1 GPU: cross-GPU agreement not tested" in r.output
    assert "1 proc x 1 dev" in r.output


@pytest.mark.parametrize("args,env,needle", [
    (["--gpus", "all", "--devices", "0"], {"FA4VERIFY_FAKE_GPUS": "2"}, "exclude each other"),
    (["--gpus", "all", "--timing"], {"FA4VERIFY_FAKE_GPUS": "2"}, "--timing"),
    (["--gpus", "3"], {"FA4VERIFY_FAKE_GPUS": "2"}, "asks for 3"),
    (["--gpus", "all", "--backend", "fa4"], {"FA4VERIFY_FAKE_GPUS": "2"}, "--backend twin"),
    (["--gpus", "nope"], {"FA4VERIFY_FAKE_GPUS": "2"}, "expected 'all'"),
    (["--gpu-timeout", "5"], {}, "--gpu-timeout needs --gpus"),
    (["--gpus", "all"], {"FA4VERIFY_FAKE_GPUS": "zero"}, "FA4VERIFY_FAKE_GPUS"),
])
def test_bad_gpus_input_is_a_one_line_usage_error(args, env, needle, monkeypatch):
    base = ["--backend", "twin", "--configs", "mha-hd64-full"] if "--backend" not in args else \
        ["--configs", "mha-hd64-full"]
    r = _det(base + args, monkeypatch, **env)
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


# ------------------------------------------------------------------------------ audit over GPUs
AUDIT = ["--no-default-checks", "--profile", "quick", "--device", "cpu", "--isolate", "never",
         "--checks-module", os.path.join(FIX, "audit_checks_ok.py"),
         "--checks-module", os.path.join(FIX, "audit_checks_undecided.py"),
         "--checks-module", os.path.join(FIX, "audit_checks_gpus.py"),
         "--opt", f"budget={os.path.join(FIX, 'budget_tight.toml')}", "--no-live"]


def _audit(args, monkeypatch, **env):
    from click.testing import CliRunner

    from fa4verify.cli.audit import command
    for k in (mg.ENV_FAKE, mg.ENV_FAKE_FAULT, mg.ENV_FAKE_CRASH, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    r = CliRunner().invoke(command, args)
    return r


def _junit(path):
    out = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        kind = next((c.tag for c in tc if c.tag in ("failure", "error", "skipped")), "pass")
        out[tc.get("name")] = kind
    return out


def test_audit_over_two_fake_gpus_has_the_verdicts_of_the_one_gpu_audit(tmp_path, monkeypatch):
    """``--gpus``: the engine's workers pinned one per GPU (``--isolate always`` puts these CPU
    checks in workers); the verdicts, counts and JUnit are the one-GPU audit's."""
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    r1 = _audit(AUDIT + ["--json", str(one), "--junit", str(tmp_path / "one.xml")], monkeypatch)
    r2 = _audit(AUDIT + ["--json", str(two), "--junit", str(tmp_path / "two.xml"), "--gpus", "all",
                         "--isolate", "always", "--workers", "1"], monkeypatch, FA4VERIFY_FAKE_GPUS="2")
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert r1.exit_code == r2.exit_code == 1, (r1.output, r2.output)   # the tight budget fails
    va = [(x["id"], x["status"]) for x in a["results"]]
    vb = [(x["id"], x["status"]) for x in b["results"]]
    assert va == vb and {s for _, s in va} >= {"pass", "fail", "undecided", "skip"}
    assert a["summary"]["counts"] == b["summary"]["counts"]
    assert _junit(tmp_path / "one.xml") == _junit(tmp_path / "two.xml")
    ran = {x["id"]: x for x in b["results"]}
    for cid in ("fixture.gpus.where_a", "fixture.gpus.where_b"):   # pinned before CUDA starts
        d = ran[cid]["details"]
        assert d["CUDA_VISIBLE_DEVICES"] in ("0", "1") and d["FA4VERIFY_GPU_INDEX"] == d["CUDA_VISIBLE_DEVICES"]
    # two workers, one per GPU, both ran tasks
    assert {t.get("gpu") for x in b["results"] if x["isolated"] for t in x["timing"]} == {"0", "1"}
    assert len(b["gpus"]) == 2


def test_audit_gpus_usage_errors(monkeypatch):
    r = _audit(AUDIT + ["--gpus", "all", "--shard", "1/2"], monkeypatch, FA4VERIFY_FAKE_GPUS="2")
    assert r.exit_code == 2 and "exclude each other" in r.output
    r = _audit(AUDIT + ["--gpus", "all"], monkeypatch)       # no fake mode, --device cpu
    assert r.exit_code == 2 and "--device is cpu" in r.output and "Traceback" not in r.output
    r = _audit(AUDIT + ["--gpus", "4"], monkeypatch, FA4VERIFY_FAKE_GPUS="2")
    assert r.exit_code == 2 and "asks for 4" in r.output


def test_a_child_whose_cuda_device_is_not_its_gpu_reports_a_pin_mismatch(monkeypatch):
    from fa4verify.determinism.multi import _gpu_identity

    props = types.SimpleNamespace(name="NVIDIA H200", uuid=U1[4:].upper(), major=9, minor=0)
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        is_available=lambda: True, get_device_properties=lambda i: props))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    ok = _gpu_identity(Gpu(1, U1, "NVIDIA H200", U1))         # same GPU, other case: no mismatch
    assert "pin_mismatch" not in ok and ok["torch_uuid"] == "GPU-" + U1[4:].upper()
    bad = _gpu_identity(Gpu(0, U0, "NVIDIA H200", U0))
    assert bad["pin_mismatch"] == (f"pinned to {U0} (CUDA_VISIBLE_DEVICES={U0}) but CUDA device 0 "
                                   f"is GPU-{U1[4:].upper()}")
    unknown = _gpu_identity(Gpu(2, "2"))
    assert unknown["uuid"] == "GPU-" + U1[4:].upper() and "pin_mismatch" not in unknown
    mig = _gpu_identity(Gpu(3, "MIG-1234", "NVIDIA H200", "MIG-1234"))   # not comparable: no verdict
    assert "pin_mismatch" not in mig
