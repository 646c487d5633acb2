"""CuTe-DSL probe kernels that isolate single FA4 stages (need flash-attn-4 + CuTe DSL)."""
