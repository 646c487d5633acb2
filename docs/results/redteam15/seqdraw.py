"""The calls sequences.production draws at a seed (default audit: 3 sequences x 5 steps, plus the
constructed sequence), enumerated on the CPU: the machine runs with the judge stubbed out (each
call recorded, none judged), so Hypothesis draws exactly what it draws on the GPU for a passing
run. Pickled as (name, layout, deterministic, problem)."""
import os, pickle, sys
os.environ["FA4VERIFY_FAKE_DEVICE"] = "h200"
from fa4verify.sequences import machine
from fa4verify.checks.sequences import _PLAN
from fa4verify.run import engine
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
n, steps = _PLAN["default"]
rec = []
def fake_judge(target, c, calls, seen, res):
    rec.append(c)
machine._judge_counted = fake_judge
class T:
    name = "production"
    def reset(self): pass
    def describe(self): return {"target": "stub"}
from fa4verify.checks.sequences import _production_cases
import inspect
src = inspect.getsource(_production_cases)
from fa4verify.checks import sequences as S
case_seed = S.case_seed
out = []
for i in range(n):
    rec.clear()
    machine.run_sequences(T(), arch="sm90", examples=1, first=1, steps=steps, seed=case_seed(seed, i),
                          target_spec=None, replay_fresh=False)
    for j, c in enumerate(rec):
        out.append((f"seq{i}.{j}", c.layout, c.deterministic, c.problem))
for j, c in enumerate(machine.constructed_calls("sm90", "bf16")):
    out.append((f"seqc.{j}", c.layout, c.deterministic, c.problem))
pickle.dump(out, open(f"./seq{seed}.pkl", "wb"))
for name, lay, det, p in out:
    print(name, lay, det, p.describe())
