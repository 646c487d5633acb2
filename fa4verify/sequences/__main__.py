"""``python -m fa4verify.sequences replay CASE.json``: replay a sequence case in this process."""
import sys

from fa4verify.sequences.machine import _main

sys.exit(_main(sys.argv[1:]))
