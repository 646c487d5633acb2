"""The eleventh round's faults as fa4verify Edit objects; checks each old text occurs exactly once
in the installed FA4 and that the patched file byte-compiles (a copy under docs/results/redteam11/copies/)."""
import os, py_compile, shutil, sys
from fa4verify.mutants.source import Edit, SourceMutant, installed_root, apply_edits

MUTANTS = (
    SourceMutant(
        "paged_cpasync_page_address_from_row_index",
        "cp.async paged KV: a page's address taken as row page * page_size + offset of the pool "
        "(compact pools only: a pool with a larger page stride -- K/V halves of one "
        "(num_pages, 2, page, hk, d) cache, an HND cache -- reads other pages)",
        (Edit("paged_kv.py",
              "                tPrXPtr[i] = utils.elem_pointer(mX, (page_offset, d_offset, page)).toint()\n",
              "                tPrXPtr[i] = utils.elem_pointer(\n"
              "                    mX, (page_offset + page * mX.shape[0], d_offset, 0)\n"
              "                ).toint()\n"),),
        "fwd", ("out", "lse")),
    SourceMutant(
        "packgqa_o_store_hdim_pred_from_q",
        "SM90 forward, cp.async PackGQA O store: the head-dim predicate flag is Q's (check_hdim_oob), "
        "not V's, so with head_dim_v padded and head_dim not, O's padded columns overwrite the next "
        "head's first columns",
        (Edit("flash_fwd.py",
              "            self.tile_m, self.tile_hdimv, self.check_hdim_v_oob, self.qhead_per_kvhead\n",
              "            self.tile_m, self.tile_hdimv, self.check_hdim_oob, self.qhead_per_kvhead\n"),),
        "fwd", ("out",)),
    SourceMutant(
        "bwd_preprocess_hdim_v_pred_from_hd",
        "backward preprocess: O/dO head-dim predicate decided by head_dim, not head_dim_v (D sums "
        "columns past head_dim_v when only head_dim_v is padded)",
        (Edit("flash_bwd_preprocess.py",
              "        self.check_hdim_v_oob = head_dim_v != self.head_dim_v_padded\n",
              "        self.check_hdim_v_oob = head_dim != self.head_dim_padded\n"),),
        "bwd", ("dq", "dk")),
    SourceMutant(
        "varlen_lpt_block_order_dropped",
        "varlen tile scheduler: the LPT reversal of the block order dropped; the deterministic varlen "
        "causal/local backward (spt dQ semaphores want the last KV block first) deadlocks once a "
        "sequence's chain of KV blocks outgrows the CTAs resident at once",
        (Edit("tile_scheduler.py",
              "                if const_expr(self.lpt):\n"
              "                    block = num_m_blocks - 1 - block\n",
              ""),),
        "bwd", (), hang=True),
)

if __name__ == "__main__":
    root = installed_root() / "cute"
    for m in MUTANTS:
        for e in m.edits:
            text = (root / e.file).read_text()
            n = text.count(e.old)
            line = text[: text.index(e.old)].count("\n") + 1 if n else None
            print(f"{m.id}: {e.file}:{line} occurrences={n}")
            assert n == 1
        dest = f"docs/results/redteam11/copies/{m.id}"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(root.parent, dest + "/flash_attn", ignore=shutil.ignore_patterns("__pycache__"))
        for e in m.edits:
            p = os.path.join(dest, "flash_attn", "cute", e.file)
            t = open(p).read()
            assert t.count(e.old) == 1
            open(p, "w").write(t.replace(e.old, e.new))
            py_compile.compile(p, doraise=True)
        print("  patched copy byte-compiles:", dest)
