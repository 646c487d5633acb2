"""fa4verify: numerical-accuracy verification for FlashAttention-4 (flash_attn.cute).

Importing this package is light: no torch, cutlass or flash_attn import happens here.
"""
__version__ = "0.1.0"

def assert_attention_within_budget(*args, **kwargs):  # pragma: no cover - thin re-export
    """See :func:`fa4verify.gates.assert_attention_within_budget`."""
    from fa4verify.gates import assert_attention_within_budget as _impl
    return _impl(*args, **kwargs)
