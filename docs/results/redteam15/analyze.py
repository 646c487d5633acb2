"""Line census from trace0.pkl: per host file, executable lines (from the compiled code objects'
co_lines, def/class header lines dropped), executed lines and the number of calls (uids) and passes
that executed each. Writes lines_<file>.txt (every executable line: count of calls, count of passes,
source) and unexec_<file>.txt (unexecuted lines grouped in runs under their enclosing function)."""
import ast, os, pickle, sys, collections
import flash_attn.cute as FA

D = os.path.dirname(FA.__file__)
here = os.path.dirname(os.path.abspath(__file__))
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
tr = pickle.load(open(f"{here}/trace{seed}.pkl", "rb"))
FILES = ["interface.py", "utils.py", "block_sparsity.py", "cute_dsl_utils.py", "cache_utils.py",
         "compute_block_sparsity.py", "fa_logging.py", "cu_blocks_kernel.py"]


def executable(path):
    src = open(path).read()
    code = compile(src, path, "exec")
    lines = set()
    todo = [code]
    while todo:
        c = todo.pop()
        for _, _, ln in c.co_lines():
            if ln is not None:
                lines.add(ln)
        todo.extend(k for k in c.co_consts if hasattr(k, "co_lines"))
    # function-name map (innermost def enclosing each line) and def/decorator header lines
    tree = ast.parse(src)
    owner, headers = {}, set()
    # module-level statements run at import (before tracing): not counted
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            headers.update(range(node.lineno, node.end_lineno + 1))
    gpu = {}      # line -> the `if not fake_mode` line guarding it (skipped under FakeTensorMode, run on a GPU)
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not):
            t = ast.unparse(node.test.operand)
            if t in ("fake_mode", "is_fake_mode()"):
                for b in node.body:
                    for ln in range(b.lineno, b.end_lineno + 1):
                        gpu[ln] = node.lineno
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            headers.update(range(node.lineno, node.body[0].lineno))   # the signature (defaults: def time)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for ln in range(node.lineno, node.end_lineno + 1):
                prev = owner.get(ln)
                if prev is None or prev[1] <= node.lineno:
                    owner[ln] = (node.name, node.lineno)
            headers.add(node.lineno)
            for dec in node.decorator_list:
                headers.update(range(dec.lineno, dec.end_lineno + 1))
    return sorted(lines - headers), owner, src.splitlines(), gpu


summary = []
for fn in FILES:
    path = os.path.join(D, fn)
    ex, owner, src, gpu = executable(path)
    calls = collections.defaultdict(set)
    passes = collections.defaultdict(set)
    for (f, ln), tags in tr["lines"].items():
        if f == path:
            for t in tags:
                uid, ps = t.split("|")
                calls[ln].add(uid)
                passes[ln].add(ps)
    for ln, g in gpu.items():       # GPU-only lines: run wherever their guard ran (every audit call on the GPU)
        if ln in ex and calls.get(g) and not calls.get(ln):
            calls[ln] = set(calls[g]); passes[ln] = {"GPU-only"}
    hit = [ln for ln in ex if calls.get(ln)]
    summary.append((fn, len(ex), len(hit), sum(1 for l in ex if l in gpu)))
    with open(f"{here}/lines_{fn}.txt", "w") as o:
        for ln in ex:
            o.write(f"{ln:5d} {len(calls.get(ln, ())):4d} {','.join(sorted(passes.get(ln, ()))):40.40s} | {src[ln-1]}\n")
    with open(f"{here}/unexec_{fn}.txt", "w") as o:
        run, cur_owner = [], None
        def flush():
            if run:
                o.write(f"--- {cur_owner[0]}@{cur_owner[1]}  lines {run[0]}-{run[-1]} ({len(run)})\n")
                for ln in range(run[0], run[-1] + 1):
                    o.write(f"{ln:5d} {'  ' if ln in run else ' .'} {src[ln-1]}\n")
        last = None
        for ln in ex:
            if calls.get(ln):
                continue
            ow = owner.get(ln, ("<module>", 0))
            if run and (ow != cur_owner or ln - last > 4):
                flush(); run = []
            cur_owner = ow
            run.append(ln); last = ln
        flush()
for fn, n, h, g in summary:
    print(f"{fn:28s} executable {n:5d} executed {h:5d} unexecuted {n-h:5d}  (GPU-only guarded lines {g})")
