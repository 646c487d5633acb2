"""Deliberately broken twin variants are FOUND by the fuzzer and SHRUNK to small shapes.

Each test runs ``fa4verify fuzz --mutation NAME`` (ci profile, seed 0) against the CPU twin with one planted fault
(``kernels/twin/forward.py`` FWD_MUTATIONS) and checks that Hypothesis finds a counterexample, that
the shrunk case is small, that the written JSON case replays as a failure on the mutant, and
that the very same problem passes on the unmutated twin (so the failure is the mutant's doing).
Figures: "CPU twin".
"""
from __future__ import annotations

import importlib
import json

import pytest

from fa4verify import fuzz

ta = importlib.import_module("fa4verify.kernels.twin.attention")

# each test is a full Hypothesis find-and-shrink (100 examples): about 100 s for the module on 2 cores
pytestmark = pytest.mark.slow


def _deps():
    import fa4verify.oracles.attention  # noqa: F401
    from fa4verify.problem import AttentionProblem
    fuzz._budget(AttentionProblem("sm90", "bf16", 1, 1, 1, 1, 1, 8, 8))


def _find(mutation: str, arch: str, tmp_path, distributions=None):
    """Run ``fa4verify fuzz --mutation NAME`` (CLI, ci profile, seed 0, 100 examples) and return
    the shrunk problem and the failure record of its ``--json`` output."""
    _deps()
    assert mutation in ta.MUTATIONS, f"the twin has no mutation {mutation!r}"
    args = ["fuzz", "--mutation", mutation, "--arch", arch, "--examples", "100", "--seed", "0",
            "--profile", "ci", "--cache-dir", str(tmp_path / "cache"), "--cases-dir", str(tmp_path / "cases"),
            "--json", str(tmp_path / "run.json")]
    for d in distributions or ():
        args += ["--distribution", d]
    # a fresh process: in a long pytest process (other test files first) this campaign has been
    # seen to miss the planted fault (CI, session 4; not yet root-caused: some in-process state
    # weakens the Hypothesis search), and `fa4verify fuzz` is a process-level entry point anyway
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "fa4verify", *args], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 1, f"{mutation} on {arch} not found:\n{r.stdout}{r.stderr}"
    data = json.loads((tmp_path / "run.json").read_text())
    f = data["failure"]
    assert f is not None, f"{mutation} on {arch} not found in {data['examples_run']} examples"
    assert f["property"] != "runs", f["message"]        # found by an accuracy property, not a crash
    problem = fuzz.AttentionProblem.from_dict(f["problem"])
    # the saved case replays as a failure on the mutant, and passes on the unmutated twin
    assert fuzz.replay_case(f["case_file"]).status == "fail"
    clean = fuzz.replay_case(f["case_file"], target=fuzz.TwinTarget(), properties=fuzz.PROPERTIES)
    assert clean.status == "pass", clean.message
    assert "@example(AttentionProblem.from_json(" in f["snippet"]
    return problem, f


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_causal_off_by_one_is_found_and_shrunk(arch, tmp_path):
    p, f = _find("causal_off_by_one", arch, tmp_path)
    # needs causal and one key shifted across the diagonal: two tokens on one side suffice
    # (seed 0 gives (2, 2) through the CLI and (2, 1) through the audit's stream)
    assert p.causal and p.batch == 1 and p.nheads == 1 and p.head_dim == 8
    assert 2 <= max(p.seqlen_q, p.seqlen_k) <= 3


def test_causal_top_left_alignment_is_found_and_shrunk(tmp_path):
    p, f = _find("causal_top_left", "sm90", tmp_path)
    # top-left vs bottom-right alignment differ only when seqlen_q != seqlen_k
    assert p.causal and p.seqlen_q != p.seqlen_k and max(p.seqlen_q, p.seqlen_k) <= 3
    assert p.batch == 1 and p.head_dim == 8


def test_tail_tile_dropped_is_found_and_shrunk(tmp_path):
    p, f = _find("tail_tile_dropped", "sm90", tmp_path)
    # any seqlen_k that is not a multiple of the KV tile has a partial tail tile; 1 is minimal
    assert p.seqlen_k == 1 and p.seqlen_q == 1 and p.head_dim == 8


@pytest.mark.parametrize("arch", ["sm90", "sm100"])
def test_rescale_skipped_is_found_and_shrunk(arch, tmp_path):
    # SM100 rescales lazily, only when a row max grows by more than 8 log2 units between KV tiles
    # (flash_attn/cute/softmax.py, rescale_threshold), which standard-normal scores rarely do: the peaked_rescale
    # distribution is built for exactly that
    dists = ("normal", "peaked_rescale") if arch == "sm100" else None
    p, f = _find("rescale_skipped", arch, tmp_path, distributions=dists)
    # a rescale needs a second KV tile: seqlen_k = tile_n + 1 = 129 is the smallest such length
    assert p.seqlen_k == 129 and p.seqlen_q == 1 and p.batch == 1 and p.head_dim == 8
