"""The core type lives in a public module without Hypothesis: ``fa4verify.problem``.

A caller that only builds, materialises and judges problems (the gate, a check's fixed cases, a
replayed case file) must not pay for -- or depend on -- the fuzzing library; the strategies that
draw problems (``fa4verify.strategies``) import it, never the reverse.
"""
from __future__ import annotations

import json
import subprocess
import sys

_SCRIPT = r"""
import json, sys
import fa4verify
from fa4verify import mods
from fa4verify.problem import AttentionProblem, CallForm, MaskMod, ValueSpec

problems = [
    AttentionProblem("sm90", "bf16", 2, 5, 7, 2, 1, 64, 64, causal=True, values=ValueSpec("edges", 3)),
    AttentionProblem("sm90", "fp16", 2, 5, 9, 2, 2, 64, 64, seqlens_q=(5, 3), seqlens_k=(9, 0),
                     call=CallForm(seqused_k=True, kv_capacity=16, page_size=16)),
    AttentionProblem("sm90", "bf16", 1, 64, 64, 1, 1, 64, 64, call=CallForm(block_size=(64, 64))),
    AttentionProblem("sm90", "bf16", 1, 64, 64, 1, 1, 64, 64, call=CallForm(mask_mod_fn="checkerboard_128")),
    AttentionProblem("sm100", "bf16", 1, 5, 9, 2, 2, 64, 64, mask_mod=MaskMod("document", 2, 1)),
    AttentionProblem("sm90", "bf16", 1, 8, 8, 2, 2, 64, 64, mods=(mods.names()[0],)),
]
for p in problems:
    a = p.materialize()
    p.keep_masks(a)
    p.kwargs(a)
    assert AttentionProblem.from_json(p.to_json()) == p
assert fa4verify.AttentionProblem is AttentionProblem       # the lazy public name, same object
print(json.dumps(sorted(m for m in sys.modules
                        if m.split(".")[0] == "hypothesis" or m.startswith("fa4verify._strategies"))))
"""


def test_problem_module_does_not_import_hypothesis():
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_the_check_sees_an_import_of_hypothesis():
    # the same probe after importing the strategies: the check can fail
    script = _SCRIPT.replace("import fa4verify\n", "import fa4verify\nimport fa4verify.strategies\n", 1)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert "hypothesis" in seen and "fa4verify._strategies.problem" in seen
