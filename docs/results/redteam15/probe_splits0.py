"""Probe: FA4 4.0.0b36 on a fake H200 (compile stubbed), flash_attn_func(num_splits=0) decode shape.
num_splits=0 asks FA4's heuristic (interface.py:419-421); the SM90 path asserts on split-KV (interface.py:1631)."""
import os
os.environ.setdefault("FA4VERIFY_FAKE_DEVICE", "h200")
from fa4verify.compile.production import enter_fake_device, _shims
enter_fake_device("h200"); _shims()
import torch, cutlass.cute as cute
from flash_attn.cute import interface as I
cute.compile = I.cute.compile = lambda *a, **k: (lambda *a, **k: None)
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode():
    for (b, sq, sk, h, hk, d, ns) in [(1, 1, 8192, 8, 1, 128, 0), (1, 1, 8192, 8, 1, 128, 1), (4, 512, 512, 8, 8, 128, 0)]:
        q = torch.empty(b, sq, h, d, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(b, sk, hk, d, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(b, sk, hk, d, dtype=torch.bfloat16, device="cuda")
        cfg = I._get_fwd_config(arch=90, head_dim=d, head_dim_v=d, causal=False, local=False, window_size_left=None,
                                window_size_right=None, max_seqlen_q=sq, max_seqlen_k=sk, qhead_per_kvhead=h // hk,
                                pack_gqa=h > hk, batch_size=b, num_head_kv=hk, num_splits=ns, device=q.device,
                                seqlen_q=sq, tile_mn=None, block_sparse_tensors=None, mma_pv_is_rs=None,
                                intra_wg_overlap=None)
        try:
            with torch.no_grad():
                I.flash_attn_func(q, k, v, num_splits=ns, return_lse=True)
            r = "ok"
        except BaseException as e:
            r = f"{type(e).__name__}: {e}"
        print(f"b{b} sq{sq} sk{sk} h{h}/{hk} d{d} num_splits={ns}: FA4 picks num_splits={cfg.num_splits} -> {r}")
