"""The eleventh round's faults (read from fa4verify's catalogue); checks each old text occurs exactly once
in the installed FA4 and that the patched file byte-compiles (a copy under $TMPDIR/redteam11/)."""
import os, py_compile, shutil, sys
from fa4verify.mutants.source import catalogue, installed_root

MUTANTS = tuple(catalogue(["paged_cpasync_page_address_from_row_index", "packgqa_o_store_hdim_pred_from_q",
                            "bwd_preprocess_hdim_v_pred_from_hd", "varlen_lpt_block_order_dropped"]))

if __name__ == "__main__":
    root = installed_root() / "cute"
    for m in MUTANTS:
        for e in m.edits:
            text = (root / e.file).read_text()
            n = text.count(e.old)
            line = text[: text.index(e.old)].count("\n") + 1 if n else None
            print(f"{m.id}: {e.file}:{line} occurrences={n}")
            assert n == 1
        dest = os.path.join(os.environ.get("TMPDIR", "/tmp"), "redteam11", m.id)
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(root.parent, dest + "/flash_attn", ignore=shutil.ignore_patterns("__pycache__"))
        for e in m.edits:
            p = os.path.join(dest, "flash_attn", "cute", e.file)
            t = open(p).read()
            assert t.count(e.old) == 1
            open(p, "w").write(t.replace(e.old, e.new))
            py_compile.compile(p, doraise=True)
        print("  patched copy byte-compiles:", dest)
