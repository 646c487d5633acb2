"""The README's coverage block is generated from the feature space and the planner and is current."""
from __future__ import annotations

from pathlib import Path

from fa4verify.coverage import table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_coverage_block_is_current(capsys):
    rc = table.main(["--check", str(README)])
    assert rc == 0, capsys.readouterr().err + " (python -m fa4verify.coverage.table --write README.md)"


def test_block_states_rows_and_full_coverage_per_arch():
    text = table.render()
    assert table.PLANS == (("sm90", "bf16"), ("sm100", "bf16"), ("sm100", "fp8"))
    for arch, dtype in table.PLANS:
        row = next(line for line in text.splitlines() if line.startswith(f"| {arch}, {dtype} |"))
        covered = row.split("|")[3].strip()
        done, need = covered.split("/")
        assert int(need) > 0 and done == need, row


def test_a_stale_block_is_reported(tmp_path, capsys):
    p = tmp_path / "README.md"
    p.write_text(f"x\n{table.START}\nold\n{table.END}\n")
    assert table.main(["--check", str(p)]) == 1
    assert table.main(["--write", str(p)]) == 0 and table.main(["--check", str(p)]) == 0
