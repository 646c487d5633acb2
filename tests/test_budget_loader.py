"""The budget files, the safe formula language, the loader's validation and the CLI."""
from __future__ import annotations

import importlib
import json
import math
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

from fa4verify.oracles import binary32 as b32
from fa4verify.error_budgets import loader
from fa4verify.error_budgets.loader import BudgetError


def _write(tmp_path, body: str, name="b.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


HEAD = """
[meta]
schema_version = 1
dtype = "bf16"
arch = "sm90"
"""


def test_every_shipped_file_loads_and_covers_every_forward_stage():
    ta = importlib.import_module("fa4verify.kernels.twin.attention")
    pairs = loader.available()
    assert {(d, a) for d in ("bf16", "fp16") for a in ("sm90", "sm100", "sm103")} <= set(pairs)
    assert ("fp8", "sm100") in pairs
    for d, a in pairs:
        s = loader.load(d, a)
        stage_names = set(s.names("stage"))
        assert stage_names >= set(ta.FWD_STAGES) - {"sink"}, (d, a)
        for e in ("forward_out", "forward_lse", "backward_dq", "backward_dk", "backward_dv"):
            assert e in s.names("e2e")
        for b in s.entries.values():
            assert "DERIVATIONS.md#" in b.reason


def test_fp8_alias_and_dtype_specific_unit_roundoffs():
    assert loader.load("fp8", "sm100").constants["u_p"] == 2.0**-4
    assert loader.load("fp8", "sm100").constants["u_out"] == 2.0**-8
    assert loader.load("fp16", "sm90").constants["u_p"] == 2.0**-11
    assert loader.load("bf16", "sm90").constants["e_exp"] < loader.load("bf16", "sm100").constants["e_exp"]


def test_mufu_constants_agree_with_the_twin_model():
    tf = importlib.import_module("fa4verify.kernels.twin.forward")
    c = loader.CONSTANTS
    assert c["mufu_ex2_rel"] == tf.MUFU_BOUNDS["ex2"]
    assert c["rcp_rel"] == tf.MUFU_BOUNDS["rcp"]
    assert c["lg2_abs"] == tf.MUFU_BOUNDS["lg2_abs"]
    assert c["tanh_rel"] == tf.MUFU_BOUNDS["tanh"]


@pytest.mark.parametrize("formula,problem", [
    ("__import__('os')", "not allowed"),
    ("p.real", "not allowed"),
    ("(lambda: 1)()", "not allowed"),
    ("[1][0]", "not allowed"),
    ("'a'", "only numbers"),
    ("u_bf16 if p else 1", "not allowed"),
    ("nosuchname * p", "unknown name"),
    ("u_bf16 * p +", "not valid"),
    ("sqrt(x=1)", "keyword"),
    ("gamma(1)", "takes 2..2"),
    ("p + abs_pv", "different units"),
    ("log2(abs_pv)", "dimensionless"),
    ("abs_pv", "has units v"),
])
def test_unsafe_or_ill_typed_formulas_are_rejected_naming_file_and_key(tmp_path, formula, problem):
    p = _write(tmp_path, HEAD + f"""
[stage.p_cast]
formula = {json.dumps(formula)}
reason = "DERIVATIONS.md#p-cast"
""")
    with pytest.raises(BudgetError) as ei:
        loader.load_file(p)
    msg = str(ei.value)
    assert str(p) in msg and "stage.p_cast" in msg and problem in msg


@pytest.mark.parametrize("body,key,problem", [
    ('[stage.p_cast]\nformula = "u_bf16 * p"\n', "stage.p_cast.reason", "missing"),
    ('[stage.p_cast]\nformula = "u_bf16 * p"\nreason = "DERIVATIONS.md#no-such"\n',
     "stage.p_cast.reason", "no section"),
    ('[stage.p_cast]\nformula = "u_bf16 * p"\nreason = "trust me"\n', "stage.p_cast.reason",
     "must cite"),
    ('[stage.p_cast]\nformula = "u_bf16 * p"\nreason = "DERIVATIONS.md#p-cast"\ncolour = 1\n',
     "stage.p_cast", "unknown key"),
    ('[stage.p_cast]\nformula = "u_bf16 * p"\nreason = "DERIVATIONS.md#p-cast"\nunit = "ulp"\n',
     "stage.p_cast.unit", "unknown unit"),
    ('[stage.p_cast]\nformula = "u_bf16 * p"\nreason = "DERIVATIONS.md#p-cast"\nconfidence = 2\n',
     "stage.p_cast.confidence", "(0, 1]"),
    ('[stage.mystery]\nformula = "u_bf16"\nreason = "DERIVATIONS.md#p-cast"\n', "stage.mystery.dim",
     "not a known stage"),
    ('[weird]\nx = 1\n', "weird", "unknown top-level"),
])
def test_schema_violations_name_file_key_and_problem(tmp_path, body, key, problem):
    p = _write(tmp_path, HEAD + body)
    with pytest.raises(BudgetError) as ei:
        loader.load_file(p)
    assert ei.value.key == key and problem in ei.value.problem and ei.value.file == str(p)


def test_bad_meta_is_rejected(tmp_path):
    p = _write(tmp_path, '[meta]\nschema_version = 2\ndtype = "bf16"\narch = "sm90"\n')
    with pytest.raises(BudgetError, match="schema_version"):
        loader.load_file(p)
    p = _write(tmp_path, '[meta]\nschema_version = 1\ndtype = "bf16"\narch = "sm80"\n')
    with pytest.raises(BudgetError, match="meta.arch"):
        loader.load_file(p)
    p = _write(tmp_path, "[meta\n")
    with pytest.raises(BudgetError, match="not valid TOML"):
        loader.load_file(p)


def test_gamma_and_probabilistic_gamma_follow_higham():
    s = loader.load("bf16", "sm90")
    u = 2.0**-24
    f = loader.Formula("gamma(n_add, u_fp32) * sum_abs", where=("-", "-"),
                       known={"n_add": (), "sum_abs": (), "u_fp32": ()})
    n = np.array([1.0, 19.0, 8192.0])
    got = f.evaluate({"n_add": n, "sum_abs": 1.0, "u_fp32": u})
    assert np.allclose(got, n * u / (1 - n * u), rtol=1e-15)
    assert loader._gamma(2, 0.5) == np.inf
    gp = loader._gamma_prob(8192, u, 6.0)
    assert math.isclose(gp, math.expm1(6 * math.sqrt(8192) * u + 8192 * u * u / (1 - u)))
    assert gp < loader._gamma(8192, u)
    assert s.evaluate("row_sum", {"n_add": 19, "sum_abs": 2.0}) == pytest.approx(2 * 19 * u / (1 - 19 * u))


def test_entries_can_use_earlier_entries_and_missing_stats_are_named():
    s = loader.load("bf16", "sm100")
    with pytest.raises(KeyError, match="needs statistic"):
        s.evaluate("forward_out", {"abs_pv": 1.0})


def test_p_cast_budget_is_attained_within_a_factor_two_on_random_p():
    """The bf16 P-cast budget is not loose: the worst measured rounding error is >= budget/2."""
    s = loader.load("bf16", "sm90")
    p = np.random.default_rng(0).random(200000).astype(np.float32)
    err = np.abs(b32.to_bf16(p).astype(np.float64) - p)
    bound = s.evaluate("p_cast", {"p": p.astype(np.float64)})
    assert (err <= bound).all()
    assert 0.5 < (err / bound).max() <= 1.0


def test_cli_show_prints_the_table_and_json():
    from fa4verify.cli.budgets import command
    r = CliRunner().invoke(command, ["show", "--dtype", "bf16", "--arch", "sm90"])
    assert r.exit_code == 0, r.output
    assert "p_cast" in r.output and "forward_out" in r.output
    r = CliRunner().invoke(command, ["show", "--dtype", "fp8", "--arch", "sm100", "--json"])
    assert r.exit_code == 0, r.output
    import json
    data = json.loads(r.output)
    assert data[0]["dtype"] == "fp8" and any(e["name"] == "p_cast" for e in data[0]["entries"])


def test_cli_malformed_file_is_exit_2_with_one_line_naming_file_and_key(tmp_path):
    from fa4verify.cli.budgets import command
    p = _write(tmp_path, HEAD + '[stage.p_cast]\nformula = "u_bf16 * p + abs_pv"\n'
               'reason = "DERIVATIONS.md#p-cast"\n')
    r = CliRunner(mix_stderr=False).invoke(command, ["show", "--file", str(p)]) \
        if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else \
        CliRunner().invoke(command, ["show", "--file", str(p)])
    assert r.exit_code == 2
    text = (getattr(r, "stderr", "") or "") + r.output
    assert str(p) in text and "stage.p_cast.formula" in text and "different units" in text
    assert "Traceback" not in text
    r = CliRunner().invoke(command, ["validate"])
    assert r.exit_code == 0 and "bf16" in r.output


def test_emu_rel_covers_the_certified_polynomial_error_plus_horner_rounding():
    """emu_rel >= certified sup |p(f)/2^f - 1| (oracles.poly_bound, interval arithmetic) plus the
    fp32 Horner rounding of the three FMAs (<= 3.5 u relative for p in [1, 2), f in [0, 1))."""
    pb = importlib.import_module("fa4verify.oracles.poly_bound")
    twin = importlib.import_module("fa4verify.kernels.twin")
    b = pb.certified_sup_rel_error([float(c) for c in twin.poly_coeffs_f32(3)], rel_tol=1e-3)
    assert b.converged
    assert b.upper + 3.5 * 2.0**-24 <= loader.CONSTANTS["emu_rel"]
    # and the constant is not loose: within 1% of the certified value
    assert loader.CONSTANTS["emu_rel"] <= 1.01 * b.lower


def _hostile_stats(rng, shape: tuple, steps: tuple[int, int, int], pick: int, scalars: bool = False) -> dict:
    """Every statistic: |normal| x 10^[-30, 2], zeros / infinities / NaNs every ``steps`` elements,
    in turn full ``shape``, (h, d), (1, h, d) and a scalar (element ``pick``); all scalars with
    ``scalars``."""
    import numpy as np
    from fa4verify.error_budgets import loader as L
    stats = {}
    for i, n in enumerate(sorted(L.STATISTICS)):
        form = 3 if scalars else i % 4
        x = rng.standard_normal(shape[1:] if form == 1 else (1,) + shape[1:] if form == 2 else shape)
        x = np.abs(x) * 10.0 ** rng.integers(-30, 3, size=x.shape)
        x.flat[:: steps[0]] = 0.0
        x.flat[1:: steps[1]] = np.inf
        x.flat[2:: steps[2]] = np.nan
        stats[n] = float(x.flat[pick]) if form == 3 else x
    return stats


def _entry_envs(stats: dict):
    """``(dtype, arch, name, budget, env)`` of every shipped budget: its constants, statistics and
    the earlier entries it reads, as BudgetSet.evaluate gives them."""
    from fa4verify.error_budgets import loader as L
    for dtype, arch in L.available():
        bs = L.load(dtype, arch)
        for name, b in bs.entries.items():
            env = dict(bs.constants)
            env.update({k: stats[k] for k in b.formula.names if k in stats})
            for k in [k for k in b.formula.names if k not in env]:
                env[k] = bs.evaluate(k, stats)
            yield dtype, arch, name, b, env


def test_a_formula_over_large_arrays_is_evaluated_by_slabs_bit_for_bit():
    """Note [Formulas by slabs]: every budget of the shipped files, on statistics of more than
    ``_CHUNKED`` elements, equals the whole-array evaluation bit for bit (zeros, infinities and
    NaNs among the statistics, arrays broadcast from (1, h, d), (h, d) and scalars)."""
    import numpy as np
    from fa4verify.error_budgets import loader as L
    stats = _hostile_stats(np.random.default_rng(5), (L._CHUNKED // (4 * 64) + 3, 4, 64), (997, 1999, 4999), 5)
    n_chunked = 0
    for dtype, arch, name, b, env in _entry_envs(stats):
        with np.errstate(all="ignore"):
            whole = np.asarray(L._eval(b.formula.tree, env), np.float64)
        got = np.asarray(b.formula.evaluate(env), np.float64)
        assert got.shape == whole.shape and got.dtype == whole.dtype and \
            np.array_equal(whole.view(np.uint64), got.view(np.uint64)), (dtype, arch, name)
        n_chunked += got.size >= L._CHUNKED
    assert n_chunked > 100       # the slabs path ran


def test_a_compiled_formula_gives_the_walk_of_its_tree_bit_for_bit(monkeypatch):
    """Note [Formulas compiled]: every budget of the shipped files, on small statistics (arrays of
    each broadcast form, scalars, zeros, infinities, NaNs) and on scalars alone, equals the walk of
    its tree (``_eval``) bit for bit; and the numpy evaluation no longer walks the tree."""
    import numpy as np
    from fa4verify.error_budgets import loader as L
    rng = np.random.default_rng(9)
    for scalars in (False, True):
        checked = 0
        for dtype, arch, name, b, env in _entry_envs(_hostile_stats(rng, (5, 3, 8), (7, 11, 13), 4, scalars)):
            with np.errstate(all="ignore"):
                walk = np.asarray(L._eval(b.formula.tree, env), np.float64)
                got = np.asarray(b.formula._fn(env), np.float64)
            assert got.shape == walk.shape and np.array_equal(walk.view(np.uint64), got.view(np.uint64)), \
                (dtype, arch, name, scalars)
            checked += 1
        assert checked > 100
    monkeypatch.setattr(L, "_eval", lambda *a, **k: (_ for _ in ()).throw(AssertionError("walked")))
    bs = L.load("bf16", "sm90")
    assert np.isfinite(bs.evaluate("p_cast", {"p": np.array([0.5])})).all()


def test_an_edited_budget_file_is_read_again_and_an_unchanged_one_is_not_validated_again(tmp_path):
    """Note [Budget sets are memoised]: the parse and the validation are kept per content, so the
    same text gives the same set, an edit (in the file or in the file it extends) gives the edited
    set, and an edit that breaks it raises."""
    import shutil

    base = tmp_path / "_base.toml"
    shutil.copy(loader.BUDGET_DIR / "_base.toml", base)
    own = tmp_path / "bf16_sm90.toml"
    shutil.copy(loader.BUDGET_DIR / "bf16_sm90.toml", own)
    first = loader.load_file(own)
    assert loader.load_file(own) is first
    text = own.read_text()
    assert "\n[constants]\n" in text
    own.write_text(text.replace("\n[constants]\n", "\n[constants]\nmy_extra = 0.5\n", 1))
    edited = loader.load_file(own)
    assert edited is not first and edited.constants["my_extra"] == 0.5
    assert "my_extra" not in first.constants
    btext = base.read_text()
    base.write_text(btext + "\n[stage.mystery]\nformula = \"u_bf16\"\nreason = \"DERIVATIONS.md#p-cast\"\n")
    with pytest.raises(BudgetError, match="not a known stage"):
        loader.load_file(own)
    base.write_text(btext)
    assert loader.load_file(own).constants == edited.constants
