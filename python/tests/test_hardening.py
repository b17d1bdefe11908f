"""Issue 27: the Python API raises ValueError naming the argument for every bad value, before any C++ is
reached (no nanobind TypeError with a signature dump, no silent float->int, no string scanned as a list,
no lenient booleans); read-only arrays are accepted; solve_topk checks S against the Session; an empty
workload is an error; uint64 values are reported as given."""
import os
import subprocess

import numpy as np
import pytest

import cpsched
import cpsched.magi as magi

from conftest import ROOT


def causal_topk(S, k=4, heads=1):
    idx = np.full((S, heads, k), -1, dtype=np.int32)
    for q in range(S):
        n = min(k, q + 1)
        idx[q, :, :n] = np.arange(q + 1 - n, q + 1)
    return idx


def session(**kw):
    kw.setdefault("cp_size", 4)
    kw.setdefault("heads", (8, 1, 16, "bf16"))
    return cpsched.Session(solver="owner", cost_model="area", **kw)


@pytest.mark.parametrize("kw, match", [
    ({"cp_size": 2 ** 31}, r"cp_size: 2147483648 is outside \[1, 1048576\]"),
    ({"cp_size": 4.7}, r"cp_size: expected an integer, got 4.7 \(float\)"),
    ({"cp_size": True}, r"cp_size: expected an integer"),
    ({"cp_size": "8"}, r"cp_size: expected an integer, got '8'"),
    ({"heads": (2 ** 40, 8, 128)}, r"heads\[0\] \(q\): 1099511627776 is outside"),
    ({"heads": None}, r"heads: expected \(q, kv, dim\)"),
    ({"heads": "64,8,128"}, r"heads: expected"),
    ({"heads": (64, 8.0, 128)}, r"heads\[1\] \(kv\): expected an integer"),
    ({"seqlen": -1}, r"seqlen: -1 is outside"),
    ({"blocks_per_rank": 0}, r"blocks_per_rank: 0 is outside"),
    ({"stages": 0}, r"stages: 0 is outside \[1, 64\]"),
    ({"stages": "three"}, r"stages: expected a number of remote stages"),
    ({"cache_size": -1}, r"cache_size: -1 is outside"),
    ({"flatten_head_groups": "no"}, r"flatten_head_groups: expected True or False, got 'no'"),
    ({"validate": 1}, r"validate: expected True or False"),
    ({"plugin_paths": "some/dir"}, r"plugin_paths: expected a list of folders, got the single path 'some/dir'"),
    ({"plugin_paths": ["/nonexistent-cpsched-dir"]}, r"plugin_paths\[0\]: '/nonexistent-cpsched-dir': no such folder"),
    ({"solver_params": [1, 2]}, r"solver_params: expected a dict"),
    ({"relay_node_size": -2}, r"relay_node_size: -2 is outside"),
])
def test_session_arguments_raise_value_error_naming_them(kw, match):
    with pytest.raises(ValueError, match=match):
        session(**kw)


def test_result_arguments():
    r = session().solve([(0, 64)], [(0, 64)], ["causal"])
    for bad, match in [(2 ** 40, r"rank: 1099511627776 is outside \[0, 3\]"), (-1, r"rank: -1 is outside"),
                       (1.0, r"rank: expected an integer"), (None, r"rank: expected an integer")]:
        with pytest.raises(ValueError, match=match):
            r.comm_meta(bad)
        with pytest.raises(ValueError, match=match):
            r.calc_meta(bad)
    with pytest.raises(ValueError, match=r"pass_: expected 'fwd' or 'bwd'"):
        r.calc_meta(0, "forward")
    with pytest.raises(ValueError, match=r"groups: expected a list"):
        r.write_svg("x.svg", groups="0,1")
    with pytest.raises(ValueError, match=r"indent: expected an integer"):
        r.to_json(indent=2.5)
    with pytest.raises(ValueError, match=r"solve_ms: expected a finite number"):
        r.to_json(solve_ms=float("nan"))


def test_an_empty_workload_is_an_error():
    with pytest.raises(ValueError, match="no slice"):
        session(seqlen=64).solve([], [], [])
    with pytest.raises(ValueError, match="selects no"):
        session().solve_topk(np.zeros((64, 1, 0), dtype=np.int32))
    with pytest.raises(ValueError, match="selects no"):
        session().solve_topk(np.full((64, 1, 4), -1, dtype=np.int32))


def test_solve_topk_checks_s_against_the_session():
    # A 2048-row array on a seqlen = 1024 Session gave an S = 2048 plan.
    with pytest.raises(ValueError, match=r"indices: 2048 rows \(S\) but the Session's seqlen is 1024"):
        session(seqlen=1024).solve_topk(causal_topk(2048))
    # S < P: a clear error, not an internal one.
    with pytest.raises(ValueError, match=r"indices: S = 3 tokens, fewer than the 4 blocks"):
        session().solve_topk(causal_topk(3))
    with pytest.raises(ValueError, match=r"indices: 2 selection heads"):
        session().solve_topk(causal_topk(64, heads=2))
    with pytest.raises(ValueError, match="causal: expected True or False"):
        session().solve_topk(causal_topk(64), causal="no")
    assert session(seqlen=64).solve_topk(causal_topk(64)).seqlen == 64


def test_read_only_and_memory_mapped_arrays_are_accepted(tmp_path):
    a = causal_topk(128)
    ro = a.copy()
    ro.flags.writeable = False
    ref = session().solve_topk(a).to_json(solve_ms=0)
    assert session().solve_topk(ro).to_json(solve_ms=0) == ref
    np.save(tmp_path / "sel.npy", a)
    mm = np.load(tmp_path / "sel.npy", mmap_mode="r")
    assert not mm.flags.writeable
    assert session().solve_topk(mm).to_json(solve_ms=0) == ref


def test_uint64_values_are_reported_as_given():
    a = np.arange(64, dtype=np.uint64).reshape(64, 1, 1)  # each query selects itself (no -1 in uint64)
    assert session().solve_topk(a).num_tasks > 0
    a[5, 0, 0] = 2 ** 63
    with pytest.raises(ValueError, match=r"indices\[5, 0, 0\] = 9223372036854775808 is outside int32"):
        session().solve_topk(a)
    q = np.array([[0, 2 ** 63]], dtype=np.uint64)
    with pytest.raises(ValueError, match="9223372036854775808 is too large"):
        session().solve(q, q, ["full"])


@pytest.mark.parametrize("kw, match", [
    ({"num_heads_kv": None}, r"num_heads_kv: expected an integer, got None"),
    ({"num_heads_q": "8"}, r"num_heads_q: expected an integer, got '8'"),
    ({"head_dim": 128.0}, r"head_dim: expected an integer"),
    ({"cp_group": object()}, r"cp_group: expected a process group with rank\(\) and size\(\)"),
    ({"cp_rank": 0, "cp_size": 4.0}, r"cp_size: expected an integer"),
    ({"dispatch_meta_q": object()}, r"dispatch_meta_q: expected the seed's DispatchMeta"),
    ({"calc_local_range": "yes"}, r"calc_local_range: expected True or False"),
])
def test_magi_arguments_raise_value_error_naming_them(kw, match):
    args = {"algorithm": "owner", "num_heads_q": 8, "num_heads_kv": 2, "head_dim": 16, "cp_rank": 0, "cp_size": 2}
    if "cp_group" in kw:
        args.pop("cp_rank"), args.pop("cp_size")
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        magi.DynamicAttnSolver(**args)


@pytest.mark.parametrize("value, flattened", [("1", True), ("true", True), ("YES", True), ("on", True),
                                              ("0", False), ("no", False), ("FALSE", False), ("Off", False)])
def test_magi_flatten_env_is_parsed_strictly(monkeypatch, value, flattened):
    monkeypatch.setenv("MAGI_ATTENTION_FLATTEN_HEAD_GROUPS", value)
    s = magi.DynamicAttnSolver("owner", 8, 2, 16, cp_rank=0, cp_size=2)
    assert s.session.options["flatten_head_groups"] is flattened


@pytest.mark.parametrize("value", ["", "maybe", "2", "truthy"])
def test_magi_flatten_env_refuses_what_is_not_a_boolean(monkeypatch, value):
    monkeypatch.setenv("MAGI_ATTENTION_FLATTEN_HEAD_GROUPS", value)
    with pytest.raises(ValueError, match="MAGI_ATTENTION_FLATTEN_HEAD_GROUPS="):
        magi.DynamicAttnSolver("owner", 8, 2, 16, cp_rank=0, cp_size=2)


def test_module_functions_check_paths():
    with pytest.raises(ValueError, match="plugin_paths: expected a list of folders"):
        cpsched.plugins("some/dir")
    with pytest.raises(ValueError, match=r"config: expected a path"):
        cpsched.run(42)
    with pytest.raises(ValueError, match="path: an empty path"):
        cpsched.Session.from_config("")


def test_npy_header_shapes_are_strict(tmp_path):
    # ("a", 1, 16) was read as shape 0, (1024.0, 1, 16) accepted.
    for shape, name in [('("a", 1, 16)', "str"), ("(1024.0, 1, 16)", "float")]:
        d = "{'descr': '<i4', 'fortran_order': False, 'shape': %s, }" % shape
        d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
        p = tmp_path / f"{name}.npy"
        p.write_bytes(b"\x93NUMPY\x01\x00" + len(d).to_bytes(2, "little") + d.encode() + bytes(4 * 1024 * 16))
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text("problem:\n  cp_size: 8\n  seqlen_per_rank: 128\n  heads: {q: 8, kv: 1, dim: 64}\n"
                       f"  mask: {{kind: topk, indices: {name}.npy}}\n")
        with pytest.raises(ValueError, match="dimensions are non-negative integers"):
            cpsched.Session.from_config(cfg)


def test_run_plans_index_masks_from_a_config():
    # cpsched.run once solved only the config's range slices: an index mask planned nothing.
    out = cpsched.run(ROOT / "configs" / "dsa.yaml",
                      {"problem.seqlen_per_rank": 256, "problem.mask.topk": 64, "problem.mask.sink": 4,
                       "problem.mask.local": 16})
    assert out["passed"]
    assert out["result"].num_tasks > 0


def test_fifo_paths_are_refused_at_once(tmp_path):
    fifo = tmp_path / "sel.npy"
    os.mkfifo(fifo)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("problem:\n  cp_size: 2\n  seqlen_per_rank: 64\n  heads: {q: 2, kv: 1, dim: 8}\n"
                   "  mask: {kind: topk, indices: sel.npy}\n")
    with pytest.raises(ValueError, match="not a regular file"):
        cpsched.Session.from_config(cfg)
