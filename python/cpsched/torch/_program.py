"""The program of one pass on one rank (core/include/cpsched/plan/program.hpp): the ordered instructions
cpsched.torch's executor interprets (_exec.py). The core emits it; this module only reads it, from the
extension's arrays (`Result.program`) or from a plan's JSON text ("cast 1 first", "reduce 2 qo forwarding",
...), and has a text's program checked by the core's `program_error`. It never makes one.
"""
from __future__ import annotations

from typing import NamedTuple

from .. import _cpsched

# The codes of Result.program's columns: the values of the core's enums Op, RowKind and Phase.
OPS = ("cast", "wait_cast", "compute", "reduce", "wait_reduces", "merge")
KINDS = ("qo", "kv")
PHASES = ("first", "forwarding")


class Instr(NamedTuple):
    op: str             # one of OPS
    stage: int          # cast, wait_cast, reduce: 1..N; compute: 0..N; wait_reduces, merge: N
    kind: str = "qo"    # reduce only
    phase: str = "first"  # cast and reduce only

    def __str__(self):
        if self.op == "cast":
            return f"cast {self.stage} {self.phase}"
        if self.op == "reduce":
            return f"reduce {self.stage} {self.kind} {self.phase}"
        return f"{self.op} {self.stage}"


def from_array(rows):
    """A program from Result.program's int32 rows (op, stage, kind, phase)."""
    return tuple(Instr(OPS[int(op)], int(stage), KINDS[int(kind)], PHASES[int(phase)])
                 for op, stage, kind, phase in rows.tolist())


def parse(text):
    """One instruction from its JSON form; ValueError (the reason) when it is not one."""
    if not isinstance(text, str):
        raise ValueError(f"expected an instruction text, got {text!r}")
    words = text.split()
    want = {"cast": 3, "reduce": 4}.get(words[0] if words else "", 2)
    if not words or words[0] not in OPS or len(words) != want or not words[1].isdigit():
        raise ValueError(f"{text!r} is not an instruction (e.g. 'cast 1 first', 'compute 0', "
                         "'reduce 1 qo forwarding', 'merge 2')")
    stage = int(words[1])
    if words[0] == "cast":
        if words[2] not in PHASES:
            raise ValueError(f"{text!r}: the phase is 'first' or 'forwarding'")
        return Instr("cast", stage, "qo", words[2])
    if words[0] == "reduce":
        if words[2] not in KINDS or words[3] not in PHASES:
            raise ValueError(f"{text!r}: expected 'reduce STAGE qo|kv first|forwarding'")
        return Instr("reduce", stage, words[2], words[3])
    return Instr(words[0], stage)


def collectives(program):
    """The instructions that issue a collective, in order: what every rank must issue alike."""
    return [i for i in program if i.op in ("cast", "reduce")]


def error(program, qo_after, kv_after, pass_):
    """Why `program` is not a runnable program of a pass whose stage-t outputs go back after stage
    qo_after[t - 1] / kv_after[t - 1]: (index of the first wrong instruction, or len(program) when the end is
    wrong, "instruction: reason"), or None when it is runnable. The core's program_error decides."""
    rows = [(OPS.index(i.op), i.stage, KINDS.index(i.kind), PHASES.index(i.phase)) for i in program]
    return _cpsched.program_error(rows, list(qo_after), list(kv_after), pass_)
