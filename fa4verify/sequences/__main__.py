"""``python -m fa4verify.sequences run ...`` (the state machine on a target) / ``replay CASE.json``."""
import sys

from fa4verify.sequences.machine import _main

sys.exit(_main(sys.argv[1:]))
