"""Old module path of the determinism worker, kept runnable: ``python -m fa4verify.determinism_worker``
is ``python -m fa4verify.determinism.worker`` (:mod:`fa4verify.determinism.worker`)."""
from __future__ import annotations

import sys

from fa4verify.determinism.worker import main

if __name__ == "__main__":
    sys.exit(main())
