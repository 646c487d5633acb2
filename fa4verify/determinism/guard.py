"""Guard bands: output buffers armed with NaN inside and a sentinel bit pattern around, checked
after every run for out-of-bounds writes and unwritten elements."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

from fa4verify.determinism.bitwise import _FORMATS, _signed, _torch, nan_count

#: Guard-band sentinel per dtype: a signalling NaN with a payload (quiet bit clear), so neither a
#: finite value nor the canonical quiet NaN a kernel may write can equal it.
SENTINEL_BITS: dict[str, int] = {"bfloat16": 0x7F8A, "float16": 0x7C5A, "float32": 0x7F8A5A5A}

#: default guard width in bytes on each side (a multiple of 128 B keeps TMA alignment)
GUARD_BYTES = 4096




@dataclass(frozen=True)
class GuardReport:
    """Result of checking one guarded buffer after a run: elements of the guard bands whose bits
    no longer equal the sentinel (``before``/``after`` counts, first offending offsets relative to
    the buffer start, negative before it) and NaN elements left in the interior."""
    name: str
    before: int
    after: int
    first_offsets: tuple[int, ...]
    nan_interior: int

    @property
    def guard_ok(self) -> bool:
        return self.before == 0 and self.after == 0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["first_offsets"] = list(self.first_offsets)
        return d


class GuardedBuffer:
    """An output buffer of ``shape``/``dtype`` with ``guard`` sentinel elements on each side.

    ``view`` is a contiguous view of the interior (what the kernel gets); ``storage`` is the whole
    allocation. :meth:`arm` writes the sentinel into the guard bands and NaN into the interior;
    :meth:`check` reports any change of the guard bands and any NaN left in the interior.
    """

    def __init__(self, name: str, shape: Sequence[int], dtype, device, guard: int | None = None,
                 guard_bytes: int | None = None):
        torch = _torch()
        self.name = name
        self.dtype = dtype
        self.dtype_name = str(dtype).replace("torch.", "")
        if self.dtype_name not in _FORMATS:
            raise TypeError(f"GuardedBuffer: unsupported dtype {dtype}")
        elsize = torch.empty((), dtype=dtype).element_size()
        if guard is None:
            guard = -(-int(guard_bytes if guard_bytes is not None else GUARD_BYTES) // elsize)
        self.guard = int(guard)
        if self.guard < 1:
            raise ValueError("guard must be >= 1 element")
        self.numel = int(math.prod(shape))
        self.storage = torch.empty(self.numel + 2 * self.guard, dtype=dtype, device=device)
        self.view = self.storage[self.guard:self.guard + self.numel].view(tuple(shape))
        nb = 16 if _FORMATS[self.dtype_name][0] == "int16" else 32
        self.sentinel = _signed(SENTINEL_BITS[self.dtype_name], nb)

    def arm(self) -> None:
        b = self.storage.view(getattr(_torch(), _FORMATS[self.dtype_name][0]))
        b.fill_(self.sentinel)
        self.view.fill_(float("nan"))

    def check(self, max_offsets: int = 5) -> GuardReport:
        torch = _torch()
        b = self.storage.view(getattr(torch, _FORMATS[self.dtype_name][0]))
        g, n = self.guard, self.numel
        bad_before = (b[:g] != self.sentinel).nonzero().reshape(-1)
        bad_after = (b[g + n:] != self.sentinel).nonzero().reshape(-1)
        offs = [int(i) - g for i in bad_before[:max_offsets].tolist()]
        offs += [n + int(i) for i in bad_after[:max(0, max_offsets - len(offs))].tolist()]
        return GuardReport(self.name, int(bad_before.numel()), int(bad_after.numel()), tuple(offs),
                           nan_count(self.view))

    def aliases(self, t) -> bool:
        """Whether ``t`` is this buffer's interior (same data pointer, shape and dtype)."""
        torch = _torch()
        return (isinstance(t, torch.Tensor) and t.data_ptr() == self.view.data_ptr()
                and tuple(t.shape) == tuple(self.view.shape) and t.dtype == self.view.dtype)
