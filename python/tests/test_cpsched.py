"""What a PyTorch user relies on: the CLI's plans and messages, every input form, errors, lifetime,
threads and the plan cache (docs/python.md, "API")."""
import concurrent.futures
import enum
import gc
import json
import os
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest

from conftest import QUICKSTART

import cpsched
from cpsched import magi

from conftest import ROOT

# A small problem solved fast by every solver: two causal documents and a full one.
Q = [[0, 3000], [3000, 5000], [5000, 8192]]
K = [[0, 3000], [3000, 5000], [5000, 8192]]
T = ["causal", "causal", "full"]


def small_session(**kw):
    opts = dict(cp_size=4, heads=(8, 2, 64, "bf16"), solver="binary_greedy")
    opts.update(kw)
    if opts["solver"] == "static":
        opts.setdefault("layout", "planned")  # static dispatches the tokens: only a planned layout allows it
    return cpsched.Session(**opts)


def cli_plan(cli, config, sets, tmp_path):
    out = tmp_path / "cli_plan.json"
    args = [cli, "plan", str(config), "-q", "-o", str(out)]
    for s in sets:
        args += ["--set", s]
    subprocess.run(args, check=True, capture_output=True, text=True)
    return out.read_bytes()


def cli_error(cli, command, config, sets):
    args = [cli, command, str(config)]
    for s in sets:
        args += ["--set", s]
    p = subprocess.run(args, capture_output=True, text=True)
    assert p.returncode == 1, p.stderr
    prefix = f"cpsched {command}: error: "
    lines = [line for line in p.stderr.splitlines() if not line.startswith("cpsched: warning")]
    text = "\n".join(lines)
    assert text.startswith(prefix), text
    # The tool and the package load the same plugins from different folders: name both alike.
    tool_plugins = os.path.realpath(os.path.join(os.path.dirname(cli), "..", "lib", "cpsched", "plugins"))
    return text[len(prefix):].replace(tool_plugins, "<plugins>")


def same_message(e):
    return str(e.value).replace(cpsched.default_plugin_dir(), "<plugins>")


# ---- the CLI's plan, byte for byte ------------------------------------------------------------

CONFIGS = [
    {},  # the quickstart: balanced_bytes under the time cost model, P = 8
    {"solver.name": "binary_greedy", "plan.stages": 2, "cost_model.name": "area"},
    {"solver.name": "usp", "problem.cp_size": 16, "problem.seqlen_per_rank": 2048, "cost_model.name": "area"},
    {"solver.name": "static", "problem.mask": "{kind: sliding_window, window: [512, 0], lengths: [40000, 25536]}",
     "cost_model.name": "area", "problem.layout": "planned"},
    {"problem.cp_size": 16, "problem.seqlen_per_rank": 2048, "plan.relay": "on"},  # relays: two nodes of 8
]


@pytest.mark.parametrize("overrides", CONFIGS)
def test_plan_json_is_the_clis_byte_for_byte(cli, quickstart, tmp_path, overrides):
    sets = [f"{k}={v}" for k, v in overrides.items()]
    cli_bytes = cli_plan(cli, quickstart, sets, tmp_path)
    cli_solve_ms = json.loads(cli_bytes)["solver"]["solve_ms"]

    s = cpsched.Session.from_config(quickstart, overrides)
    r = s.solve_config()
    # The one measured field (solver wall time) is the CLI's; every other byte is compared.
    assert r.to_json(solve_ms=cli_solve_ms).encode() == cli_bytes

    # The same mask as arrays through solve() gives the same plan (a cache hit of the same key).
    m = cpsched.mask_from_config(quickstart, overrides)
    r2 = s.solve(m.q_ranges, m.k_ranges, m.types)
    assert r2.cached
    assert r2.to_json(solve_ms=cli_solve_ms).encode() == cli_bytes


def test_metrics_equal_the_clis(cli, quickstart, tmp_path):
    cli_json = json.loads(cli_plan(cli, quickstart, [], tmp_path))
    m = cpsched.Session.from_config(quickstart).solve_config().metrics
    ref = cli_json["metrics"]
    for p in ("fwd", "bwd"):
        assert m[p]["total_send"] == ref[p]["total_send"]
        assert m[p]["bottleneck"] == ref[p]["bottleneck"]
        assert m[p]["send"].tolist() == ref[p]["send"]
        assert m[p]["recv"].tolist() == ref[p]["recv"]
    assert m["load"].tolist() == ref["load"]
    assert m["imbalance"] == pytest.approx(ref["imbalance"], rel=1e-12)


def test_predicted_compute_per_rank_and_pass(quickstart, tmp_path):
    # Without a kernel table a rank's compute is its FLOPs at the peak rates: on the full mask the ranks' sum
    # is 4 x S^2 x 64 heads x D at 550 TFLOP/s forward, 2.5x that at 420 backward. With the table (the
    # bundled profile) every rank's compute costs more: tiles and rates below the peak.
    hw = (quickstart.parent / "hardware" / "h100_8x_nvlink.yaml").read_text().splitlines()
    start = next(i for i, l in enumerate(hw) if l.startswith("kernel:"))
    end = next(i for i in range(start + 1, len(hw)) if hw[i] and not hw[i][0].isspace() and not hw[i].startswith("#"))
    flat = tmp_path / "h100_flat.yaml"
    flat.write_text("\n".join(hw[:start] + hw[end:]) + "\n")
    S = 2 * 1024
    s = cpsched.Session.from_config(quickstart, {"problem.cp_size": 2, "problem.seqlen_per_rank": 1024,
                                                 "problem.mask": "{kind: full}"})
    r = s.solve_config()
    fwd = sum(r.predicted_compute(k, hardware=str(flat))["fwd"] for k in range(2))
    bwd = sum(r.predicted_compute(k, hardware=str(flat))["bwd"] for k in range(2))
    flops = 4.0 * S * S * 64 * 128
    assert fwd == pytest.approx(flops / 550e12, rel=1e-12)
    assert bwd == pytest.approx(2.5 * flops / 420e12, rel=1e-12)
    for k in range(2):
        own = r.predicted_compute(k)  # the profile the plan was made on: the bundled one, with its table
        assert own == r.predicted_compute(k, hardware="h100_8x_nvlink")
        plain = r.predicted_compute(k, hardware=str(flat))
        for p in ("fwd", "bwd"):
            assert plain[p] < own[p] < 2 * plain[p]
    with pytest.raises(ValueError, match="rank"):
        r.predicted_compute(2)
    with pytest.raises(ValueError, match="hardware"):
        r.predicted_compute(0, hardware=3)
    with pytest.raises(ValueError, match="no_such_profile"):
        r.predicted_compute(0, hardware="no_such_profile")
    # A plan made without a profile (the area cost model) needs one named.
    a = cpsched.Session.from_config(quickstart, {"problem.cp_size": 2, "problem.seqlen_per_rank": 1024,
                                                 "cost_model.name": "area"}).solve_config()
    with pytest.raises(ValueError, match="hardware"):
        a.predicted_compute(0)
    assert a.predicted_compute(0, hardware=str(flat))["fwd"] > 0


# ---- inputs: lists, numpy, DLPack, __array__ ---------------------------------------------------

class DLPackOnly:
    """A foreign tensor with the DLPack protocol only (no __array__, no buffer): torch-like."""

    def __init__(self, a):
        self._a = np.ascontiguousarray(a)

    def __dlpack__(self, **kw):
        return self._a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class ArrayOnly:
    """An object with the __array__ protocol only."""

    def __init__(self, a):
        self._a = np.asarray(a)

    def __array__(self, dtype=None, copy=None):
        return self._a if dtype is None else self._a.astype(dtype)


class SeedMaskType(enum.Enum):  # the seed's AttnMaskType values
    FULL = "full"
    CAUSAL = "causal"
    INVCAUSAL = "inv_causal"
    BICAUSAL = "bi_causal"


def test_program_rows_are_the_plan_texts_instructions():
    r = small_session(stages=2).solve(Q, K, T)
    d = json.loads(r.to_json(tasks=False))
    ops = ["cast", "wait_cast", "compute", "reduce", "wait_reduces", "merge"]
    for e in d["ranks"]:
        for pass_ in ("fwd", "bwd"):
            rows = r.program(e["rank"], pass_)
            assert rows.dtype == np.int32 and rows.shape[1] == 4
            text = []
            for op, stage, kind, phase in rows.tolist():
                t = f"{ops[op]} {stage}"
                if ops[op] == "reduce":
                    t += " " + ("qo", "kv")[kind]
                if ops[op] in ("cast", "reduce"):
                    t += " " + ("first", "forwarding")[phase]
                text.append(t)
            assert text == e[pass_]["program"]
    with pytest.raises(ValueError):
        r.program(0, "sideways")


def test_every_input_form_gives_the_same_plan():
    s = small_session()
    ref = s.solve(Q, K, T)
    assert not ref.cached
    ref_json = ref.to_json(solve_ms=0)
    forms = [
        (np.array(Q, dtype=np.int64), np.array(K, dtype=np.int64), np.array([1, 1, 0])),
        (np.array(Q, dtype=np.int32), np.array(K, dtype=np.uint32), np.array([1, 1, 0], dtype=np.int8)),
        (np.asfortranarray(np.array(Q)), np.array(K)[:, :], ["causal", "causal", "full"]),
        (DLPackOnly(np.array(Q, dtype=np.int32)), DLPackOnly(np.array(K)), DLPackOnly(np.array([1, 1, 0]))),
        (ArrayOnly(Q), ArrayOnly(K), ArrayOnly([1, 1, 0])),
        ([tuple(x) for x in Q], K, [SeedMaskType.CAUSAL, SeedMaskType.CAUSAL, SeedMaskType.FULL]),
        (Q, K, np.array(["causal", "causal", "full"])),
    ]
    for q, k, t in forms:
        r = s.solve(q, k, t)
        assert r.cached, (q, k, t)
        assert r.to_json(solve_ms=0) == ref_json
    # One type for every slice (the seed accepts a single AttnMaskType).
    all_causal = s.solve(Q, K, "causal").to_json(solve_ms=0)
    assert s.solve(Q, K, [1, 1, 1]).to_json(solve_ms=0) == all_causal
    assert s.solve(Q, K, SeedMaskType.CAUSAL).cached
    assert s.cache_stats["hits"] >= len(forms) + 1


def test_torch_tensors_if_installed():
    torch = pytest.importorskip("torch")  # never a dependency; checked when present
    s = small_session()
    ref = s.solve(Q, K, T).to_json(solve_ms=0)
    r = s.solve(torch.tensor(Q), torch.tensor(K, dtype=torch.int32), torch.tensor([1, 1, 0]))
    assert r.cached and r.to_json(solve_ms=0) == ref


def test_local_tail_only_in_plans_for_a_cluster():
    # With a hardware profile (the time cost model) two stages end with a local tail that moves nothing.
    t = small_session(stages=2, cost_model="time").solve(Q, K, T)
    assert t.local_tail and t.num_stages == 3 and len(t.calc_meta(0).remote_attn_args) == 3
    for rank in range(4):
        last = t.comm_meta(rank, "bwd").stages[-1]
        assert last.num_remote_qo_tokens == 0 and last.num_remote_kv_tokens == 0
    a = small_session(stages=2, cost_model="area").solve(Q, K, T)
    assert not a.local_tail and a.num_stages == 2
    assert json.loads(t.to_json(solve_ms=0))["local_tail"] is True
    assert "local_tail" not in json.loads(a.to_json(solve_ms=0))


def test_result_fields_are_numpy_arrays():
    r = small_session(stages=2).solve(Q, K, T)
    calc = r.calc_meta(0)
    assert isinstance(calc.local_attn_args.q_ranges, np.ndarray)
    assert calc.local_attn_args.q_ranges.shape[1] == 2
    assert len(calc.remote_attn_args) == 2 == r.num_stages
    for rank in range(4):
        for p in ("fwd", "bwd"):
            comm = r.comm_meta(rank, p)
            assert len(comm.stages) == 2
            for st in comm.stages:
                for kind in (st.qo, st.kv):
                    assert isinstance(kind.input_split_sizes, np.ndarray)
                    assert isinstance(kind.output_split_sizes, np.ndarray)
                    assert isinstance(kind.src_index, np.ndarray)
                    assert len(kind.dst_indices) == len(kind.input_split_sizes)
                    assert all(rank not in d.tolist() for d in kind.dst_indices)
                    assert kind.output_split_sizes.sum() >= 0
                # Relays' forwarding phase: present and empty unless the plan asks for relays.
                assert st.qo_fwd.input_split_sizes.size == 0 and len(st.kv_fwd.dst_indices) == 0
                assert st.num_remote_qo_tokens == int(st.qo.output_split_sizes.sum())
                assert st.num_remote_kv_tokens == int(st.kv.output_split_sizes.sum())
            assert comm.num_remote_kv_tokens_per_stage == [st.num_remote_kv_tokens for st in comm.stages]
    # What one rank sends is what the others receive from it (forward KV, stage 1).
    sent = sum(int(r.comm_meta(0).stages[0].kv.input_split_sizes[i]) * len(d)
               for i, d in enumerate(r.comm_meta(0).stages[0].kv.dst_indices))
    got = sum(int(sz) for rank in range(1, 4) for sz, src in
              zip(r.comm_meta(rank).stages[0].kv.output_split_sizes, r.comm_meta(rank).stages[0].kv.src_index)
              if src == 0)
    assert sent == got
    assert r.validate() == []
    m = r.metrics
    assert set(m) >= {"fwd", "bwd", "load", "imbalance", "stage0_share"}
    assert m["fwd"]["send"].shape == (4,)


# ---- errors ------------------------------------------------------------------------------------

def test_relays_fill_the_forwarding_phase():
    kw = dict(cp_size=16, heads=(8, 2, 64, "bf16"), solver="owner", cost_model="area")
    masks = ([[0, 32768]], [[0, 32768]], ["full"])
    plain = cpsched.Session(**kw).solve(*masks)
    relayed = cpsched.Session(relay_node_size=8, **kw).solve(*masks)
    fwd = [st.kv_fwd for rank in range(16) for st in relayed.comm_meta(rank).stages]
    assert any(len(a.input_split_sizes) for a in fwd) and any(len(a.output_split_sizes) for a in fwd)
    assert not any(len(st.kv_fwd.input_split_sizes) for rank in range(16) for st in plain.comm_meta(rank).stages)
    assert relayed.validate() == []
    assert relayed.metrics["fwd"]["total_send"] == plain.metrics["fwd"]["total_send"]  # same placement


BAD_SESSIONS = [
    (dict(cp_size=0), "cp_size: 0 is outside [1, 1048576]"),
    (dict(stages=-1), "stages: -1 is outside [1, 64]"),
    (dict(seqlen=-5), "seqlen: -5 is outside [0, "),
    (dict(solver="no_such_solver"), "no solver plugin named 'no_such_solver'"),
    (dict(cost_model="nope"), "no cost_model plugin named 'nope'"),
    (dict(solver_params={"no_param": 1}), "solver 'binary_greedy' has no parameter 'no_param'"),
    (dict(solver_params={"mu": "high"}), "parameter 'mu' of solver 'binary_greedy' expects real"),
    (dict(solver_params={"mu": [1]}), "solver_params['mu']: expected bool, int, float or str, got list"),
    (dict(heads=(8, 2)), "heads: expected (q, kv, dim) or (q, kv, dim, dtype)"),
    (dict(heads=(8, 2, 64, "int4")), "heads: unknown dtype 'int4'"),
    (dict(stages="many"), "stages: expected a number of remote stages (1-64) or 'auto'"),
    (dict(cache_size=-1), "cache_size: -1 is outside [0, "),
]


@pytest.mark.parametrize("kw,msg", BAD_SESSIONS)
def test_bad_session_options_are_value_errors(kw, msg):
    with pytest.raises(ValueError) as e:
        small_session(**kw)
    assert msg in str(e.value)


BAD_MASKS = [
    ([[0, 10]], [[0, 10], [10, 20]], ["full"], "session: 1 q ranges, 2 k ranges and 1 mask types (must be equal)"),
    ([[0, 10, 3]], [[0, 10]], ["full"], "q_ranges: expected N (begin, end) pairs, an array of shape (N, 2)"),
    ([[0.0, 10.0]], [[0, 10]], ["full"], "q_ranges: expected integer token positions, got dtype float64"),
    ([[0, 10]], [[0, 10]], ["diagonal"], "types[0]: unknown mask type 'diagonal'"),
    ([[0, 10]], [[0, 10]], [7], "types[0]: mask type 7 is not one of 0 full"),
    ([[0, 10]], [[0, 10]], np.array([9]), "types[0]: mask type 9 is not one of 0 full"),
    ([[0, 10]], [[0, 10]], [1.5], "types[0]: a mask type is a name"),
    ([[10, 5]], [[0, 10]], ["full"], "slice 0"),
    ([[0, 10]], [[-4, 10]], ["full"], "slice 0"),
    ("not ranges", [[0, 10]], ["full"], "q_ranges"),
    ([], [], [], "q_ranges, k_ranges: no slice"),
]


@pytest.mark.parametrize("q,k,t,msg", BAD_MASKS)
def test_bad_masks_are_value_errors(q, k, t, msg):
    s = small_session()
    with pytest.raises(ValueError) as e:
        s.solve(q, k, t)
    assert msg in str(e.value)


class DeviceTensor:
    """A tensor on an accelerator: its DLPack export refuses a host copy, as torch's does."""

    def __dlpack__(self, **kw):
        raise BufferError("the tensor is on device cuda:0")

    def __dlpack_device__(self):
        return (2, 0)


def test_device_tensors_are_refused_with_advice():
    with pytest.raises(ValueError, match=r"q_ranges: cannot read it as a host array .*cuda:0.*\.cpu\(\)"):
        small_session().solve(DeviceTensor(), K, T)


def test_bad_result_queries_are_value_errors(tmp_path):
    r = small_session().solve(Q, K, T)
    with pytest.raises(ValueError, match=r"rank: 4 is outside \[0, 3\]"):
        r.calc_meta(4)
    with pytest.raises(ValueError, match=r"rank: -1 is outside"):
        r.comm_meta(-1)
    with pytest.raises(ValueError, match="pass_: expected 'fwd' or 'bwd', got 'back'"):
        r.comm_meta(0, "back")
    with pytest.raises(ValueError, match="no_such_folder"):
        r.write_svg(tmp_path / "no_such_folder" / "x.svg")
    with pytest.raises(ValueError):
        r.write_svg(tmp_path / "x.svg", groups=[99])


CONFIG_ERRORS = [
    ["problem.cp_size=0"],
    ["problem.heads.kv=3"],
    ["solver.name=nope"],
    ["problem.mask={kind: nope}"],
    ["solver.params.balanced_bytes.mu=fast"],
    ["no_such_key=1"],
]


@pytest.mark.parametrize("sets", CONFIG_ERRORS)
def test_config_errors_carry_the_clis_message(cli, quickstart, sets):
    expected = cli_error(cli, "plan", quickstart, sets)
    with pytest.raises(ValueError) as e:
        cpsched.Session.from_config(quickstart, sets).solve_config()
    assert same_message(e) == expected


def test_missing_config_file(cli, tmp_path):
    missing = tmp_path / "missing.yaml"
    expected = cli_error(cli, "plan", missing, [])
    with pytest.raises(ValueError) as e:
        cpsched.Session.from_config(missing)
    assert same_message(e) == expected


def test_plugin_failure_is_a_runtime_error(cli, quickstart):
    # usp refuses an unflattened grid from inside the plugin: a plugin failure, not bad Python input.
    sets = ["solver.name=usp", "problem.grid.flatten_head_groups=false", "cost_model.name=area"]
    expected = cli_error(cli, "plan", quickstart, sets)
    with pytest.raises(RuntimeError) as e:
        cpsched.Session.from_config(quickstart, sets).solve_config()
    assert not isinstance(e.value, ValueError)
    assert same_message(e) == expected
    with pytest.raises(RuntimeError, match="needs flattened head groups"):
        small_session(solver="usp", flatten_head_groups=False).solve(Q, K, T)


def test_run_without_executor_is_the_clis_error(cli, quickstart):
    sets = ["executor.name="]
    expected = cli_error(cli, "run", quickstart, sets)
    with pytest.raises(ValueError) as e:
        cpsched.run(quickstart, sets)
    assert same_message(e) == expected


def test_overrides_must_be_a_dict_or_strings(quickstart):
    with pytest.raises(ValueError, match="overrides: expected a dict"):
        cpsched.Session.from_config(quickstart, 42)


# ---- lifetime, threads, cache ------------------------------------------------------------------

@pytest.mark.parametrize("solver", ["balanced_bytes", "binary_greedy", "static", "usp", "owner"])
def test_result_outlives_its_session(solver, tmp_path):
    s = small_session(solver=solver)
    r = s.solve(Q, K, T)
    before = r.to_json(solve_ms=0)
    ref = weakref.ref(s)
    del s
    gc.collect()
    assert ref() is None
    # Everything still works: the plan, the assignment and the plugin's grid are held by the result.
    assert r.to_json(solve_ms=0) == before
    assert r.validate() == []
    assert len(r.comm_meta(1, "bwd").stages) == 1
    assert r.calc_meta(3).local_attn_args.q_ranges.dtype == np.int64
    assert os.path.getsize(r.write_svg(tmp_path / "p.svg")) > 0
    arrays = r.comm_meta(0).stages[0].kv.input_split_sizes
    del r
    gc.collect()
    assert arrays.sum() >= 0  # numpy arrays own their data


def test_separate_sessions_on_threads_give_the_sequential_results():
    masks = [
        (Q, K, T),
        ([[0, 8192]], [[0, 8192]], ["causal"]),
        ([[0, 4096], [4096, 8192]], [[0, 4096], [0, 8192]], ["full", "causal"]),
        ([[0, 2000], [2000, 8192]], [[0, 2000], [2000, 8192]], ["bi_causal", "inv_causal"]),
    ]
    solvers = ["balanced_bytes", "binary_greedy", "static", "usp"]
    expected = {(m, sv): small_session(solver=sv).solve(*masks[m]).to_json(solve_ms=0)
                for m in range(len(masks)) for sv in solvers}
    got, errors = {}, []

    def work(sv):
        try:
            s = small_session(solver=sv, cache_size=0)  # every call solves
            for _ in range(3):
                for m in range(len(masks)):
                    got.setdefault((m, sv), set()).add(s.solve(*masks[m]).to_json(solve_ms=0))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(sv,)) for sv in solvers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for key, texts in got.items():
        assert texts == {expected[key]}


def test_one_session_shared_by_threads_is_serialised():
    s = small_session(cache_size=0)
    ref = s.solve(Q, K, T).to_json(solve_ms=0)
    out, errors = [], []

    def work():
        try:
            for _ in range(5):
                out.append(s.solve(Q, K, T).to_json(solve_ms=0))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and out == [ref] * 15


def test_the_gil_is_released_while_solving(quickstart):
    # A solve of ~0.1 s (P = 64, made ahead: the full search): while it runs this thread keeps running.
    # With the GIL held, the longest gap between two of its iterations would be the whole solve; released, only the OS's
    # scheduling (the solver's own threads share the cores) separates them. Three tries absorb a
    # busy machine; a held GIL fails all three.
    s = cpsched.Session.from_config(quickstart, {"problem.cp_size": 64, "plan.cache_size": 0, "plan.uses": "ahead"})
    m = cpsched.mask_from_config(quickstart, {"problem.cp_size": 64})
    seen = []
    for _ in range(3):
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", s.solve(m.q_ranges, m.k_ranges, m.types)))
        gap, last = 0.0, time.perf_counter()
        t.start()
        while t.is_alive():
            now = time.perf_counter()
            gap, last = max(gap, now - last), now
        t.join()
        call_s = box["r"].call_ms / 1000
        assert call_s > 0.02
        seen.append((gap, call_s))
        if gap < 0.5 * call_s:
            return
    pytest.fail(f"the longest pause of the main thread (s) against the solve (s): {seen}")


def test_repeated_masks_hit_the_cache():
    s = small_session()
    a = s.solve(Q, K, T)
    b = s.solve(np.array(Q), np.array(K), [1, 1, 0])
    c = s.solve(Q, K, ["full", "causal", "full"])
    assert not a.cached and b.cached and not c.cached
    assert s.cache_stats["hits"] == 1 and s.cache_stats["misses"] == 2
    assert b.to_json(solve_ms=0) == a.to_json(solve_ms=0)
    assert b.call_ms < a.call_ms
    off = small_session(cache_size=0)
    off.solve(Q, K, T)
    assert not off.solve(Q, K, T).cached


# ---- plugins, run, the seed's API, the example ------------------------------------------------

def test_plugins_come_from_the_package():
    names = {(p["kind"], p["name"]) for p in cpsched.plugins()}
    assert {("solver", "balanced_bytes"), ("solver", "binary_greedy"), ("cost_model", "time"),
            ("executor", "sim")} <= names
    if "CPSCHED_PLUGIN_PATH" not in os.environ:
        pkg = os.path.dirname(cpsched._cpsched.__file__)
        assert cpsched.default_plugin_dir() == os.path.realpath(os.path.join(pkg, "plugins")) or \
            os.path.isdir(cpsched.default_plugin_dir())
        for p in cpsched.plugins():
            if p["file"] == "<built-in>":  # the area and time cost models
                assert (p["kind"], p["name"]) in {("cost_model", "area"), ("cost_model", "time")}
                continue
            assert os.path.dirname(p["file"]) == cpsched.default_plugin_dir()
    bg = next(p for p in cpsched.plugins() if p["name"] == "binary_greedy")
    assert any(x["name"] == "mu" and x["type"] == "real" for x in bg["params"])
    assert cpsched.plugin_problems() == []


def test_run_returns_the_executors_report(quickstart):
    rep = cpsched.run(quickstart, {"problem.cp_size": 4, "problem.seqlen_per_rank": 2048})
    assert rep["passed"] is True and rep["executor"] == "sim"
    assert rep["figures"] and all(isinstance(v, float) for v in rep["figures"].values())
    assert rep["text"]
    direct = cpsched.Session.from_config(quickstart, {"problem.cp_size": 4, "problem.seqlen_per_rank": 2048})
    assert rep["result"].to_json(solve_ms=0) == direct.solve_config().to_json(solve_ms=0)


@pytest.mark.parametrize("config", ["dsa.yaml", "nsa.yaml"])
def test_run_on_index_masks_plans_what_the_cli_plans(cli, config, tmp_path):
    # cpsched.run() solved only the range part of an index-mask config once
    # (0 tasks, exit 0); it now takes the one host path the CLI takes.
    cfg = QUICKSTART.parent / config
    sets = {"problem.seqlen_per_rank": 1024}
    rep = cpsched.run(cfg, sets)
    res = rep["result"]
    assert res.num_tasks > 0
    out = tmp_path / "plan.json"
    subprocess.run([cli, "plan", str(cfg), "--set", "problem.seqlen_per_rank=1024", "-q", "-o", str(out)],
                   check=True, capture_output=True)
    mine, theirs = json.loads(res.to_json()), json.loads(out.read_text())
    assert len(mine["tasks"]) == len(theirs["tasks"]) == res.num_tasks
    assert mine["metrics"] == theirs["metrics"]
    assert mine["metrics"]["fwd"]["total_send"] >= 0 and sum(mine["metrics"]["load"]) > 0
    ran = subprocess.run([cli, "run", str(cfg), "--set", "problem.seqlen_per_rank=1024"], check=True,
                         capture_output=True, text=True).stdout
    assert f"{res.num_tasks} tasks" in ran


class FakeProcessGroup:  # torch.distributed.ProcessGroup's rank() / size()
    def __init__(self, rank, size):
        self._r, self._s = rank, size

    def rank(self):
        return self._r

    def size(self):
        return self._s


class BinaryGreedyParallelDynamicAttnAlgorithm:  # the seed's algorithm class, by name
    pass


class FakeAttnRange:
    def __init__(self, start, end):
        self.start, self.end = start, end


class FakeDispatchMeta:
    def __init__(self, rank, size, total, host_ranges):
        self.cp_rank, self.cp_size, self.total_seqlen = rank, size, total
        self.host_ranges_per_rank = host_ranges


def test_magi_drop_in_matches_the_session(tmp_path):
    solver = magi.DynamicAttnSolver(algorithm=BinaryGreedyParallelDynamicAttnAlgorithm(), num_heads_q=8,
                                    num_heads_kv=2, head_dim=64, cp_group=FakeProcessGroup(2, 4))
    assert not solver.is_solved
    solver.solve([FakeAttnRange(*r) for r in Q], [FakeAttnRange(*r) for r in K],
                 [SeedMaskType.CAUSAL, SeedMaskType.CAUSAL, SeedMaskType.FULL])
    ref = small_session().solve(Q, K, T)
    calc, comm = solver.make_calc_meta(), solver.make_comm_meta()
    assert calc.local_attn_arg.to_list() == ref.calc_meta(2).local_attn_args.to_list()
    assert [a.to_list() for a in calc.remote_attn_args_list] == \
        [a.to_list() for a in ref.calc_meta(2).remote_attn_args]
    want = ref.comm_meta(2)
    assert comm.num_remote_kv_tokens_per_stage == want.num_remote_kv_tokens_per_stage
    assert comm.num_remote_qo_tokens_per_stage == want.num_remote_qo_tokens_per_stage
    for got, exp in zip(comm.kv_group_collective_args_list + comm.qo_group_collective_args_list,
                        want.kv_group_collective_args_list + want.qo_group_collective_args_list):
        assert got.input_split_size_list == exp.input_split_size_list
        assert got.dst_indices_list == exp.dst_indices_list
        assert got.output_split_size_list == exp.output_split_size_list
        assert got.src_index_list == exp.src_index_list
    path = solver.output_solve_result(visualize=True, save_path=tmp_path / "solver_output.png")
    assert path.endswith("solver_output.svg") and open(path).read().startswith("<svg")
    assert solver.output_solve_result() is None
    # The seed's dispatch meta: rank, size and sequence length from it; sequential sharding checked.
    seq = [[(0, 2048)], [(2048, 4096)], [(4096, 6144)], [(6144, 8192)]]
    d = magi.DynamicAttnSolver("binary_greedy", 8, 2, 64, None, FakeDispatchMeta(1, 4, 8192, seq),
                               FakeDispatchMeta(1, 4, 8192, seq))
    d.solve(Q, K, T)
    assert d.make_comm_meta("bwd").num_remote_qo_tokens_per_stage == \
        ref.comm_meta(1, "bwd").num_remote_qo_tokens_per_stage
    reordered = [seq[1], seq[0], seq[2], seq[3]]
    with pytest.raises(ValueError, match="fixed sequential sharding"):
        magi.DynamicAttnSolver("binary_greedy", 8, 2, 64, None, FakeDispatchMeta(0, 4, 8192, reordered))
    with pytest.raises(ValueError, match="multiple of num_heads_kv"):
        magi.DynamicAttnSolver("binary_greedy", 8, 3, 64, FakeProcessGroup(0, 4))
    with pytest.raises(ValueError, match="cannot tell which solver"):
        magi.DynamicAttnSolver(object(), 8, 2, 64, FakeProcessGroup(0, 4))
    with pytest.raises(ValueError, match="nothing solved yet"):
        magi.DynamicAttnSolver("owner", 8, 2, 64, FakeProcessGroup(0, 4)).make_calc_meta()


def test_example_plan_layer_runs():
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "python" / "plan_layer.py")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "rank 0" in p.stdout and "stage 1" in p.stdout


def test_example_plan_ahead_runs_and_every_plan_is_a_cache_hit():
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "python" / "plan_ahead.py"), "--steps", "3", "--cp", "4",
                        "--step-ms", "10"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = [line.split() for line in p.stdout.splitlines()[2:5]]
    assert [r[0] for r in rows] == ["0", "1", "2"] and all(r[5] == "True" for r in rows)
    assert "cache hits: 3" in p.stdout


def test_package_version_is_the_libraries():
    # pyproject.toml's version is written by hand: it must follow CMake's
    # project version, which the plugins' build signature carries.
    import re
    from conftest import ROOT
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'^version = "([^"]+)"', text, re.M)
    assert m, "no version in pyproject.toml"
    cm = re.search(r"project\(cpsched VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text())
    assert m.group(1) == cm.group(1) == cpsched.__version__


# ---- layout, uses and per-rank plans (docs/python.md) ------------------------------------------

def test_fixed_layout_keeps_the_sequential_shards_and_planned_may_dispatch():
    fixed = small_session(solver="balanced_bytes", cost_model="time").solve(Q, K, T)
    assert fixed.layout == "fixed"
    seq = [[(b, e)] for b, e in cpsched._cpsched.sharding_ranges(8192, 4)]
    assert fixed.host_ranges == seq
    planned = small_session(solver="static").solve(Q, K, T)
    assert planned.layout == "planned" and planned.host_ranges != seq
    assert sorted(r for rs in planned.host_ranges for r in rs)[-1][1] == 8192
    assert json.loads(planned.to_json())["problem"]["layout"] == "planned"
    with pytest.raises(RuntimeError, match="problem.layout: fixed rules out"):
        small_session(solver="static", layout="fixed").solve(Q, K, T)


def test_rank_session_builds_that_ranks_plan_only_and_it_equals_the_full_plans():
    full = small_session(solver="balanced_bytes", stages=2).solve(Q, K, T)
    for r in range(4):
        mine = small_session(solver="balanced_bytes", stages=2, rank=r).solve(Q, K, T)
        assert mine.rank == r and full.rank is None
        assert json.loads(mine.to_json())["ranks"] == [json.loads(full.to_json())["ranks"][r]]
        for p in ("fwd", "bwd"):
            assert repr(mine.calc_meta(r, p)) == repr(full.calc_meta(r, p))
        with pytest.raises(ValueError, match=f"builds rank {r}'s plan only"):
            mine.calc_meta((r + 1) % 4)


def test_layout_uses_and_rank_options_are_checked_and_reported():
    s = small_session(layout="planned", uses="ahead", rank=3)
    assert (s.options["layout"], s.options["uses"], s.options["rank"]) == ("planned", "ahead", 3)
    assert small_session(uses=32).options["uses"] == 32
    assert small_session().options["uses"] is None and small_session().options["rank"] is None
    with pytest.raises(ValueError, match="layout: expected 'fixed'"):
        small_session(layout="dispatched")
    with pytest.raises(ValueError, match="uses"):
        small_session(uses=0)
    with pytest.raises(ValueError, match="uses"):
        small_session(uses="later")
    with pytest.raises(ValueError, match="rank"):
        small_session(rank=4)


# ---- planning ahead: solve_async ---------------------------------------------------------------

def _docs(cut, S=8192):
    return [[0, cut], [cut, S]], [[0, cut], [cut, S]], ["causal", "causal"]


def test_solve_async_plans_what_solve_plans_and_solve_then_hits_the_cache():
    ahead = small_session(solver="balanced_bytes", cost_model="time", stages="auto")
    futs = [ahead.solve_async(*_docs(c)) for c in (1000, 3000, 1000, 6000)]
    assert all(isinstance(f, concurrent.futures.Future) for f in futs)
    results = [f.result(timeout=120) for f in futs]
    now = small_session(solver="balanced_bytes", cost_model="time", stages="auto")
    for c, r in zip((1000, 3000, 1000, 6000), results):
        assert r.to_json(solve_ms=0) == now.solve(*_docs(c)).to_json(solve_ms=0)
    again = ahead.solve(*_docs(3000))
    assert again.cached
    assert ahead.solve_async(*_docs(3000)).done()  # cached: ready at once
    assert ahead.cache_stats["size"] == 3


def test_solve_async_errors_and_a_collected_session_leaves_no_future_waiting():
    s = small_session(ahead_queue=1)
    with pytest.raises(ValueError, match="1 q ranges, 2 k ranges"):
        s.solve_async([[0, 10]], [[0, 10], [10, 20]], ["full"])
    with pytest.raises(ValueError, match="ahead_queue"):
        small_session(ahead_queue=0)
    bad = small_session(solver="static", layout="fixed")
    with pytest.raises(RuntimeError, match="problem.layout: fixed rules out"):
        bad.solve_async(*_docs(2000)).result(timeout=60)  # the solver's error is the Future's
    futs = [s.solve_async(*_docs(c)) for c in (500, 1500, 2500, 3500)]
    del s
    gc.collect()
    done, not_done = concurrent.futures.wait(futs, timeout=120)
    assert not not_done
    for f in futs:
        e = f.exception()
        assert e is None or "closed before this mask" in str(e)
