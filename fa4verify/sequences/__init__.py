"""Call sequences: stateful fuzzing of FA4's compile cache (Note [Call sequences],
:mod:`fa4verify.sequences.machine`) against what the installed FA4's compile key holds (Note
[Compile-key attributes], :mod:`fa4verify.sequences.key`)."""
from __future__ import annotations

from fa4verify.sequences.key import ATTRIBUTES, NOT_DRIVEN, analyse, left_out
from fa4verify.sequences.machine import (VARIED, Call, KeyedTwinTarget, SequenceProductionTarget, classify,
                                         judge_call, make_target, replay, run_sequences, write_case)

__all__ = ["ATTRIBUTES", "NOT_DRIVEN", "analyse", "left_out", "VARIED", "Call", "KeyedTwinTarget",
           "SequenceProductionTarget", "classify", "judge_call", "make_target", "replay", "run_sequences",
           "write_case"]
