"""scripts/gpu_triage_case.py on the CPU twin: every variant of a recorded failure is well formed and
judged (the twin is right, so each passes); a planted twin fault makes the recorded case fail."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASE = ROOT / "docs/results/h200/seeds/audit_seed2_failures.json"


def test_variants_of_the_seed2_paged_row_run_on_the_twin(tmp_path):
    out = tmp_path / "t.json"
    p = subprocess.run([sys.executable, "scripts/gpu_triage_case.py", "--case", str(CASE), "--target", "twin",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = json.loads(out.read_text())["variants"]
    labels = [r["variant"] for r in rows]
    assert labels[0] == "as recorded" and {"sink off", "page_size 128", "not paged (seqused_k only)"} <= set(labels)
    assert {r["outcome"] for r in rows} == {"pass"}, rows


def test_a_triage_json_replays_its_own_case(tmp_path):
    """The script's --json names its case, so a recorded triage replays as it is (the varlen
    block-sparse finding's reproducer: docs/results/h200/triage_5c59db7/)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_triage_case as g
    finally:
        sys.path.pop(0)
    rec = ROOT / "docs/results/h200/triage_5c59db7/triage.json"
    p = g.load_problem(rec, None)
    assert p.to_dict() == json.loads(rec.read_text())["case"] and p.varlen and p.call.block_size == (128, 96)
