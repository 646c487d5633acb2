"""Rough classification of the unexecuted runs of unexec_<file>.txt (keyword rules on the run's own
lines and its function name): error/assert, MLA, SM100/SM120/SM80-only, fp8/descale, scheduler
metadata (SM100 varlen), or 'relevant' (SM90 host code no audit call executes). Writes relevant_<file>.txt."""
import re, sys, collections
RULES = [("mla", r"mla|qv\b|qv_|gather|sparse_mla|dq_dqv|_dk@|row_max|scale_p|o_lo|Kb64|topk"),
         ("sm100/120/80", r"arch // 10 in \[10, 11\]|arch // 10 == 12|arch // 10 == 8|Sm100|Sm120|Sm80|2cta|clc|ping_pong|hd256|is_hdim256|SM100|SM120|SM 8|num_threads = (128|384)|tile_count_semaphore|q_stage = 2"),
         ("scheduler_metadata", r"scheduler_metadata"),
         ("fp8", r"fp8|descale"),
         ("error/assert", r"raise |assert |ValueError|RuntimeError|must be|not supported|NotImplemented")]
for fn in sys.argv[1:]:
    runs, cur = [], None
    for line in open(f"unexec_{fn}.txt"):
        if line.startswith("---"):
            cur = [line, []]; runs.append(cur)
        elif cur is not None:
            cur[1].append(line)
    tally = collections.Counter(); rel = []
    for head, body in runs:
        n = int(re.search(r"\((\d+)\)", head).group(1))
        text = head + "".join(body)
        cls = next((c for c, rx in RULES if re.search(rx, text)), "relevant")
        tally[cls] += n
        if cls == "relevant":
            rel.append(text)
    open(f"relevant_{fn}.txt", "w").write("".join(rel))
    print(fn, dict(tally))
