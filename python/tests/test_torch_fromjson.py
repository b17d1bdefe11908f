"""TorchPlan.from_json validates the whole plan before any rank uses it (docs/torch.md, "Plans as text"):
every tampered field raises a ValueError naming it, on every rank alike (they all get the same text), and a
fuzz target mutates real plans at random: each mutation gives a clear ValueError or, run on gloo ranks, the
exact attention of the text's own mask (never a hang, a crash or other numbers). CPSCHED_FUZZ_ITERS sets the
number of mutations (a short deterministic run in CI), CPSCHED_FUZZ_SEED their seed and CPSCHED_FUZZ_RUNS how many
accepted ones run on the ranks (12)."""
import copy
import json
import os
import random
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cpsched  # noqa: E402
import cpsched.torch as cpt  # noqa: E402
from torch_pool import get_pool  # noqa: E402

S = 96


def plan_text(P=3, mask=None, **kw):
    kw.setdefault("heads", (4, 2, 16, "fp32"))
    s = cpsched.Session(cp_size=P, seqlen=S, **kw)
    return s.solve(*(mask or ([[0, S]], [[0, S]], ["causal"]))).to_json()


def tamper(d, what):
    """One field of a P = 3 owner plan of a causal mask changed as a hostile text would."""
    r2, r0 = d["ranks"][2]["fwd"], d["ranks"][0]["fwd"]
    st0 = r0["comm"]["stages"][0]
    if what == "k_beyond_buffer":
        r2["calc"]["remote_attn_args"][0][3]["k"] = [96, 100000]
    elif what == "k_negative":
        r2["calc"]["remote_attn_args"][0][0]["k"] = [-16, 32]
    elif what == "q_beyond_local":
        r2["calc"]["local_attn_args"][0]["q"] = [0, 500]
    elif what == "type_changed":
        r2["calc"]["local_attn_args"][0]["type"] = "full"
    elif what == "group_out_of_range":
        r2["calc"]["local_attn_args"][0]["group"] = 7
    elif what == "split_size_not_range":
        st0["kv"]["input_split_sizes"][0] = 16
    elif what == "input_range_oob":
        st0["kv"]["input_ranges"][0] = [1000, 1032]
    elif what == "negative_split":
        st0["kv"]["input_split_sizes"][0] = -32
        st0["kv"]["input_ranges"][0] = [32, 0]
    elif what == "dst_rank_oob":
        st0["kv"]["dst_indices"][0] = [7]
    elif what == "output_splits_mismatch":
        c = d["ranks"][2]["fwd"]["comm"]["stages"][0]
        c["kv"]["output_split_sizes"][0] = 16
        c["num_remote_kv_tokens"] -= 16
    elif what == "drop_stage_rank2":
        r2["comm"]["stages"] = []
        r2["calc"]["remote_attn_args"] = []
    elif what == "reduce_after_0":
        r2["comm"]["stages"][0]["kv_reduce_after"] = 0
    elif what == "mask_changed":
        d["problem"]["mask"][0]["type"] = "full"
    elif what == "host_ranges_overlap":
        d["problem"]["host_ranges"][1] = [[16, 64]]
    return d


TAMPERED = {
    "k_beyond_buffer": r"ranks\[2\]\.fwd\.calc\.remote_attn_args\[0\]\[3\]\.k: \[96, 100000\) is not a range inside",
    "k_negative": r"ranks\[2\]\.fwd\.calc\.remote_attn_args\[0\]\[0\]\.k: \[-16, 32\)",
    "q_beyond_local": r"ranks\[2\]\.fwd\.calc\.local_attn_args\[0\]\.q: \[0, 500\) is not a range inside the local",
    "type_changed": r"ranks\[\*\]\.fwd\.calc: the args do not compute the mask exactly",
    "mask_changed": r"ranks\[\*\]\.fwd\.calc: the args do not compute the mask exactly",
    "group_out_of_range": r"ranks\[2\]\.fwd\.calc\.local_attn_args\[0\]\.group: 7 is above 1",
    "split_size_not_range": r"ranks\[0\]\.fwd\.comm\.stages\[0\]\.kv\.input_split_sizes\[0\]: 16 rows, but its range",
    "input_range_oob": r"ranks\[0\]\.fwd\.comm\.stages\[0\]\.kv\.input_ranges\[0\]: \[1000, 1032\)",
    "negative_split": r"ranks\[0\]\.fwd\.comm\.stages\[0\]\.kv\.input_split_sizes\[0\]: -32 is below 0",
    "dst_rank_oob": r"ranks\[0\]\.fwd\.comm\.stages\[0\]\.kv\.dst_indices\[0\]\[0\]: 7 is above 2",
    "output_splits_mismatch": r"ranks\[2\]\.fwd\.comm\.stages\[0\]\.kv\.output_split_sizes: rank 2 expects",
    "drop_stage_rank2": r"ranks\[2\]\.fwd\.comm\.stages: expected 1 entries, got 0",
    "reduce_after_0": r"ranks\[2\]\.fwd\.comm\.stages\[0\]\.kv_reduce_after: 0: stage 1 receives KV rows",
    "host_ranges_overlap": r"problem\.host_ranges\[\d\]: the ranks' ranges do not cover the sequence once",
}


@pytest.mark.parametrize("what", sorted(TAMPERED))
def test_a_tampered_field_raises_naming_it_on_every_rank(what):
    d = tamper(json.loads(plan_text(solver="owner")), what)
    text = json.dumps(d)
    for rank in range(3):
        with pytest.raises(ValueError, match="^plan: " + TAMPERED[what]):
            cpt.TorchPlan.from_json(text, rank)


def test_the_untampered_text_loads_and_equals_the_results_plan():
    text = plan_text(solver="owner")
    r = cpsched.Session(cp_size=3, seqlen=S, heads=(4, 2, 16, "fp32"), solver="owner").solve([[0, S]], [[0, S]],
                                                                                              ["causal"])
    for rank in range(3):
        assert cpt.TorchPlan.from_json(text, rank).digest == cpt.TorchPlan(r, rank).digest


@pytest.mark.parametrize("rank", [True, 1.0, -1, 3, "0", None])
def test_a_rank_that_is_not_a_rank_of_the_plan_raises_naming_it(rank):
    with pytest.raises(ValueError, match=r"^rank: "):
        cpt.TorchPlan.from_json(plan_text(), rank)


def test_text_that_is_not_a_plan_raises():
    for bad, pat in (("{", "plan: the text is not JSON"), ("[]", "plan: the plan: expected an object"),
                     ('{"problem": {}}', "plan: problem.seqlen: missing"), (b"\xff", "plan: the text is not JSON"),
                     (42, "text: expected")):
        with pytest.raises(ValueError, match=re.escape(pat)):
            cpt.TorchPlan.from_json(bad, 0)


def test_top_k_text_without_index_rows_raises_at_load():
    rng = np.random.default_rng(0)
    full = np.full((32, 1, 4), -1, dtype=np.int32)
    for q in range(32):
        n = min(4, q + 1)
        full[q, 0, :n] = np.sort(rng.choice(q + 1, n, replace=False))
    r = cpsched.Session(cp_size=1, seqlen=32, heads=(4, 1, 16, "fp32")).solve_topk(full)
    cpt.TorchPlan.from_json(r.to_json(), 0)
    for kw in ({"index_rows": False}, {"tasks": False, "index_rows": False}):
        with pytest.raises(ValueError, match=r"no index pool \(it was exported with index_rows=False"):
            cpt.TorchPlan.from_json(r.to_json(**kw), 0)


def test_a_rank_plan_text_loads_for_its_rank_only():
    s = cpsched.Session(cp_size=3, seqlen=S, heads=(4, 2, 16, "fp32"), rank=1, stages=2)
    text = s.solve([[0, S]], [[0, S]], ["causal"]).to_json()
    tp = cpt.TorchPlan.from_json(text, 1)
    assert tp.per_rank and tp.rank == 1 and getattr(tp, "error", None) is None
    # another rank gets a plan that raises in the call's agreement (every rank that loaded the text together)
    other = cpt.TorchPlan.from_json(text, 0)
    assert re.match(r"plan: the text holds the plan of rank 1 only", other.error)


# ---- the fuzz target ------------------------------------------------------------------------------------------

def _leaves(x, path=()):
    if isinstance(x, dict):
        yield path, x
        for k, v in x.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(x, list):
        yield path, x
        for i, v in enumerate(x):
            yield from _leaves(v, path + (i,))
    else:
        yield path, x


def _set(d, path, value):
    for p in path[:-1]:
        d = d[p]
    d[path[-1]] = value


def mutate(d, rng):
    """One random change of a plan's field: nine times in ten one that runs (problem, ranks, stages,
    local_tail), else any (format, solver, metrics, ...)."""
    d = copy.deepcopy(d)
    keys = ("problem", "ranks", "stages", "local_tail") if rng.random() < 0.9 else tuple(d)  # mostly what runs
    spots = [(p, v) for p, v in _leaves({k: d[k] for k in keys if k in d}) if p]
    path, v = spots[rng.randrange(len(spots))]
    if isinstance(v, bool):
        new = rng.choice([not v, 0, 1, None])
    elif isinstance(v, int):
        new = rng.choice([v + 1, v - 1, 0, -1, v * 2, rng.randrange(0, S + 2), 1 << 40, v + 0.5, None, str(v)])
    elif isinstance(v, str):
        new = rng.choice(["full", "causal", "inv_causal", "bi_causal", "local", "remote", "", v + "x"])
    elif isinstance(v, list):
        op = rng.randrange(5)
        new = list(v)
        if op == 0 and new:
            new.pop(rng.randrange(len(new)))
        elif op == 1 and new:
            new.insert(rng.randrange(len(new) + 1), copy.deepcopy(new[rng.randrange(len(new))]))
        elif op == 2 and len(new) > 1:
            i, j = rng.sample(range(len(new)), 2)
            new[i], new[j] = new[j], new[i]
        elif op == 3:
            new = []
        else:
            new = {"x": new}
    elif not isinstance(v, dict):  # a float or null
        new = rng.choice([0, -1.0, 1e300, "x", None, [v]])
    else:  # dict: drop a key
        new = dict(v)
        if new:
            new.pop(rng.choice(sorted(new)))
    _set(d, path, new)
    return d


def _executed(d):
    return json.dumps({k: d.get(k) for k in ("problem", "ranks", "stages", "local_tail")}, sort_keys=True)


BASES = {  # (P, the plan's text)
    "owner_causal": (3, lambda: plan_text(solver="owner")),
    "docs_stages2": (3, lambda: plan_text(mask=([[0, 40], [40, 96]], [[0, 40], [40, 96]], ["causal", "full"]),
                                          stages=2)),
    "unflattened": (3, lambda: plan_text(mask=([[0, 50], [50, 96]], [[0, 50], [50, 96]], ["full", "causal"]),
                                         flatten_head_groups=False, solver="binary_greedy")),
    "relays": (4, lambda: cpsched.Session(cp_size=4, seqlen=128, heads=(4, 2, 16, "fp32"), solver="owner",
                                          relay_node_size=2, stages=2).solve([[0, 128]], [[0, 128]],
                                                                             ["causal"]).to_json()),
}


def test_fuzz_from_json_mutations_raise_clearly_or_run_exactly():
    iters = int(os.environ.get("CPSCHED_FUZZ_ITERS", "240"))
    rng = random.Random(int(os.environ.get("CPSCHED_FUZZ_SEED", "1234")))
    accepted = {P: [] for P, _ in BASES.values()}
    counts = {"rejected": 0, "accepted": 0, "unchanged": 0}
    names = sorted(BASES)
    bases = {n: (BASES[n][0], json.loads(BASES[n][1]())) for n in names}
    for i in range(iters):
        P, base = bases[names[i % len(names)]]
        d = mutate(base, rng)
        text = json.dumps(d)
        try:
            tps = [cpt.TorchPlan.from_json(text, r) for r in range(P)]
        except ValueError as e:
            assert str(e).startswith(("plan: ", "rank: ")), str(e)
            counts["rejected"] += 1
            continue
        # (any other exception fails the test: a clear ValueError or a plan that runs)
        if _executed(d) == _executed(base):
            counts["unchanged"] += 1
            continue
        counts["accepted"] += 1
        assert all(tp.rank == r for r, tp in enumerate(tps))
        accepted[P].append(text)
    for P, texts in accepted.items():
        if not texts:
            continue
        texts = texts[:int(os.environ.get("CPSCHED_FUZZ_RUNS", "12"))]  # each runs forward and backward on every rank
        out = get_pool(P).values("text_case", timeout=180, texts=texts)
        for j in range(len(texts)):
            res = [out[r][j] for r in range(P)]
            kinds = {x[0] for x in res}
            assert len(kinds) == 1, res  # every rank the same outcome
            if res[0][0] == "error":
                assert len({x[1] for x in res}) == 1, res
            elif res[0][0] == "skip":
                continue
            else:
                tol = 2e-2 if res[0][2] == "torch.bfloat16" else 1e-5
                assert max(x[1] for x in res) <= tol, (res, texts[j][:300])
    print("from_json fuzz:", counts, {P: len(t) for P, t in accepted.items()})
    assert counts["rejected"] > iters // 3, counts
