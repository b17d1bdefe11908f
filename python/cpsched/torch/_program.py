"""The program of one pass on one rank (core/include/cpsched/plan/program.hpp): the ordered instructions
cpsched.torch's executor interprets (_exec.py). The core emits it; this module only reads it, from the
extension's arrays (`Result.program`) or from a plan's JSON text ("cast 1 first", "reduce 2 qo forwarding",
...), and checks a text's program the way the core's `program_error` does. It never makes one.
"""
from __future__ import annotations

from typing import NamedTuple

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
    missing, reason), or None when it is runnable: the core's program_error. Stages are cast once per phase
    (first, then forwarding) before they are waited for, waited for before they are computed, computed once
    each in order; each (stage, kind) is reduced once per phase (forwarding, then first) no earlier than after
    its reduce stage; then wait_reduces and merge, last."""
    n = len(qo_after)
    point = lambda t, after: after if t <= after <= n else n  # noqa: E731 - the core's reduce_point
    cast, waited, reduced = set(), set(), set()
    computed, waited_reduces, merged = -1, False, False
    for k, i in enumerate(program):
        why = ""
        remote = 1 <= i.stage <= n
        if merged:
            why = "an instruction after merge"
        elif i.op == "cast":
            if not remote:
                why = "a cast of a stage outside 1..N"
            elif (i.stage, i.phase) in cast:
                why = "a second cast of the same stage and phase"
            elif i.phase == "forwarding" and (i.stage, "first") not in cast:
                why = "a forwarding cast before its first phase"
            cast.add((i.stage, i.phase))
        elif i.op == "wait_cast":
            if not remote:
                why = "a wait for a stage outside 1..N"
            elif not {(i.stage, "first"), (i.stage, "forwarding")} <= cast:
                why = "a wait for a stage not cast in both phases"
            elif i.stage in waited:
                why = "a second wait for the same stage"
            waited.add(i.stage)
        elif i.op == "compute":
            if i.stage != computed + 1:
                why = f"compute {i.stage} where stage {computed + 1} comes next"
            elif i.stage > n:
                why = "a compute of a stage outside 0..N"
            elif i.stage >= 1 and i.stage not in waited:
                why = "a stage computed before its casts are waited for"
            computed = max(computed, i.stage) if not why else computed
        elif i.op == "reduce":
            if not remote:
                why = "a reduce of a stage outside 1..N"
            elif i.kind == "kv" and pass_ == "fwd":
                why = "a KV reduce in the forward pass"
            else:
                at = point(i.stage, (qo_after if i.kind == "qo" else kv_after)[i.stage - 1])
                if computed < at:
                    why = f"a reduce before stage {at} (its *_reduce_after) is computed"
                elif (i.stage, i.kind, i.phase) in reduced:
                    why = "a second reduce of the same stage, kind and phase"
                elif i.phase == "first" and (i.stage, i.kind, "forwarding") not in reduced:
                    why = "a first-phase reduce before its forwarding phase"
            reduced.add((i.stage, i.kind, i.phase))
        elif i.op == "wait_reduces":
            if waited_reduces:
                why = "a second wait_reduces"
            elif computed != n:
                why = "wait_reduces before every stage is computed"
            else:
                kinds = ("qo",) if pass_ == "fwd" else ("qo", "kv")
                t = next((t for t in range(1, n + 1) for kd in kinds for ph in PHASES
                          if (t, kd, ph) not in reduced), None)
                if t is not None:
                    why = f"wait_reduces before stage {t}'s outputs are reduced in both phases"
            waited_reduces = True
        elif i.op == "merge":
            if not waited_reduces:
                why = "merge before wait_reduces"
            merged = True
        if why:
            return k, f"{i}: {why}"
    return None if merged else (len(program), "the program does not end with merge")
