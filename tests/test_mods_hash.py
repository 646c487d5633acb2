"""FA4 keys a score_mod / mask_mod kernel on ``utils.hash_callable``: the source plus ``repr()`` of
each closure value and default. A closure over a function or any object whose repr holds its
address makes the key new in every process, so FA4's disk cache never serves that kernel (seen
on the H200: a warm audit recompiled the rel_scale kernels, 6 compiles, 25 s). Every registered
pair's CuTe callables must hash the same in two processes."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

_SCRIPT = """
import json
from fa4verify import mods
from flash_attn.cute import utils
out = {}
for name in mods.names():
    p = mods.get(name)
    for side, fn in (("fwd", p.cute()), ("bwd", p.cute_bwd())):
        if fn is not None:
            out[f"{name}:{side}"] = utils.hash_callable(fn, set_cute_hash=False)
from fa4verify.problem.calls import mask_mod_pairs
for name, pair in mask_mod_pairs().items():          # the call forms' CuTe mask_mods ("fn:...")
    out[f"fn:{name}"] = utils.hash_callable(pair.load(), set_cute_hash=False)
print(json.dumps(out))
"""


@pytest.mark.fa4
def test_every_pair_has_a_process_stable_fa4_hash():
    runs = [json.loads(subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                                      check=True, timeout=300).stdout.strip().splitlines()[-1]) for _ in range(2)]
    assert runs[0] and runs[0].keys() == runs[1].keys()
    moved = sorted(k for k in runs[0] if runs[0][k] != runs[1][k])
    assert not moved, f"FA4 compile keys that change from process to process: {moved}"
