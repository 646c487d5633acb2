"""Production source mutants: the patcher (CPU). The GPU run is scripts/gpu/source_mutants.sh."""
from __future__ import annotations

import subprocess
import sys

import pytest

from fa4verify.mutants import source as sm

pytestmark = pytest.mark.fa4


@pytest.fixture(scope="module")
def root():
    return sm.installed_root()


@pytest.mark.parametrize("mutant", sm.CATALOGUE, ids=lambda m: m.id)
def test_every_edit_applies_exactly_once_to_installed_source(root, mutant):
    for f in sorted({e.file for e in mutant.edits}):
        text = (root / "cute" / f).read_text()
        new = sm.apply_edits(text, mutant.edits, f)
        assert new != text
        for e in mutant.edits:
            if e.file == f:
                assert text.count(e.old) == 1


def test_edit_matching_twice_or_never_is_refused():
    e = sm.Edit("x.py", "a = 1\n", "a = 2\n")
    with pytest.raises(sm.EditError, match="matched 2 times"):
        sm.apply_edits("a = 1\na = 1\n", [e], "x.py")
    with pytest.raises(sm.EditError, match="matched 0 times"):
        sm.apply_edits("b = 1\n", [e], "x.py")


def test_private_copy_is_patched_fingerprinted_and_installed_untouched(root, tmp_path):
    before = sm.source_digest(root)
    m = sm.catalogue(["dpsum_bias_2m10"])[0]
    c = sm.make_copy(m, tmp_path / "m")
    ctl = sm.make_copy(None, tmp_path / "c")
    assert sm.source_digest(root) == before
    assert c.original_digest == before == ctl.original_digest
    assert c.fingerprint != ctl.fingerprint
    patched = (c.path / "flash_attn" / "cute" / "flash_bwd_preprocess.py").read_text()
    assert m.edits[0].new in patched and m.edits[0].old not in patched
    assert sm.source_digest(ctl.path / "flash_attn") == before
    env = sm.worker_env(c, tmp_path / "cache")
    assert env["PYTHONPATH"].split(":")[0] == str(c.path)
    assert c.fingerprint[:16] in env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"]


@pytest.mark.slow
def test_patched_copy_imports_first_on_path(tmp_path):
    c = sm.make_copy(sm.catalogue(["dropped_rescale"])[0], tmp_path / "m")
    code = ("import flash_attn.cute.flash_fwd_sm90 as f, flash_attn.cute.interface, inspect;"
            "print(f.__file__); assert 'mutant: softmax.rescale_O' in inspect.getsource(f)")
    r = subprocess.run([sys.executable, "-c", code], env=sm.worker_env(c, tmp_path / "cache"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert str(c.path) in r.stdout


def test_unknown_mutant_id_is_named():
    with pytest.raises(KeyError, match="nope"):
        sm.catalogue(["nope"])


@pytest.mark.slow
def test_a_hash_that_keeps_the_defaults_text_but_drops_the_values_fools_the_reading_not_the_sequence(tmp_path):
    """``callable_hash_default_values_dropped``: FA4's callable hash still names ``__defaults__``
    but no longer hashes their values. Read from the mutated copy's text, the key still carries a
    default-captured constant, yet two ``default_slope`` functions of different slopes now hash
    alike (they would share a kernel); the constructed sequence varies that constant anyway
    (Note [Constructed sequence]: :data:`BY_CALLABLE`), so the audit meets the collision."""
    c = sm.make_copy(sm.catalogue(["callable_hash_default_values_dropped"])[0], tmp_path / "m")
    code = ("from fa4verify import mods\n"
            "from fa4verify.sequences import key, machine\n"
            "from flash_attn.cute.utils import hash_callable\n"
            "p = mods.get(machine.DEFAULTS_PAIR)\n"
            "h = {hash_callable(p.cute((c,)), set_cute_hash=False) for c in (0.125, 0.25)}\n"
            "calls = machine.constructed_calls('sm90')\n"
            "seeds = {x.problem.mod_seed for x in calls if x.problem.mods == (machine.DEFAULTS_PAIR,)}\n"
            "print(len(h), 'defaults' in key.callable_hash_covers(), 'mod_defaults' in key.left_out(), len(seeds))\n")
    r = subprocess.run([sys.executable, "-c", code], env=sm.worker_env(c, tmp_path / "cache"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["1", "True", "False", "2"], r.stdout
