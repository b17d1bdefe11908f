"""It moves what the plan says: the bytes each rank's collectives send, counted by wrapping
torch.distributed.all_to_all_single, against the plan's metrics (docs/design.md#metrics byte counts)."""
import pytest

torch = pytest.importorskip("torch")

from torch_pool import get_pool  # noqa: E402

CASES = [
    (4, {"mask": "causal_document", "solver": "balanced_bytes", "stages": 2}),
    (3, {"mask": "full_document", "solver": "binary_greedy", "stages": 1, "dtype": "bf16"}),
    (4, {"mask": "causal", "solver": "static", "stages": 2}),
    (2, {"mask": "topk", "heads": {"q": 4, "kv": 1, "dim": 48, "dim_v": 32, "kv_shared": True}, "spr": 96,
         "topk": 12}),
    (4, {"mask": "share_question", "solver": "usp", "heads": {"q": 4, "kv": 2, "dim": 24, "dim_v": 16}}),
]


@pytest.mark.parametrize("P,spec", CASES, ids=[f"P{p}-{s['mask']}-{s.get('solver', 'bb')}" for p, s in CASES])
def test_each_rank_sends_the_plans_bytes(P, spec):
    res = get_pool(P).values("bytes_case", timeout=120, spec=spec)
    m = res[0]["metrics"]
    assert sum(m["fwd"]["send"]) > 0 and sum(m["bwd"]["send"]) > 0, "a plan that moves nothing proves nothing"
    for r, x in enumerate(res):
        for p in ("fwd", "bwd"):
            assert x[p]["send"] == m[p]["send"][r], (r, p, x[p], m[p]["send"][r])
            assert x[p]["recv"] == m[p]["recv"][r], (r, p, x[p], m[p]["recv"][r])


def _row_bytes(pr, pass_, kind, direction):
    """Bytes of one (token, head group) row of a collective (docs/design.md#metrics, docs/heads.md); 0: no such reduce."""
    G = pr["head_groups"]
    hqg, hkg = pr["heads_q"] // G, pr["heads_kv"] // G
    dqk = pr["head_dim"]
    dv = pr.get("head_dim_v", dqk) or dqk
    b = pr["dtype_bytes"]
    shared = pr.get("kv_shared", False)
    kv = hkg * (dqk if shared else dqk + dv) * b
    if kind == "kv":
        return kv if direction == "cast" or pass_ == "bwd" else 0
    if pass_ == "fwd":
        return hqg * dqk * b if direction == "cast" else hqg * (dv * b + 4)
    return hqg * ((dqk + 2 * dv) * b + 4) if direction == "cast" else hqg * dqk * b


def relay_adjustment(plan):
    """Per pass, per rank: (extra sent, extra received) on the wire against the direct transfers the metrics
    count. A relay r forwarding n rows of source s's split to the ranks D of its node sends |D| n cast rows that
    s no longer sends; in the reduce the ranks of D send their n rows to r instead of s, so r receives |D| n
    reduce rows more and s as many fewer. Nobody else's bytes change."""
    pr = plan["problem"]
    P = pr["cp_size"]
    out = {}
    for p in ("fwd", "bwd"):
        send, recv = [0] * P, [0] * P
        for r, rk in enumerate(plan["ranks"]):
            for st in rk[p]["comm"]["stages"]:
                for kind in ("qo", "kv"):
                    fw = st.get(kind + "_fwd")
                    if not fw:
                        continue
                    first = st[kind]
                    starts, at = [], 0
                    for size, src in zip(first["output_split_sizes"], first["src_index"]):
                        starts.append((at, at + size, src))
                        at += size
                    for (b, e), dst in zip(fw["input_ranges"], fw["dst_indices"]):
                        src = next(s for lo, hi, s in starts if lo <= b and e <= hi)
                        n = (e - b) * len(dst)
                        send[r] += n * _row_bytes(pr, p, kind, "cast")
                        send[src] -= n * _row_bytes(pr, p, kind, "cast")
                        recv[r] += n * _row_bytes(pr, p, kind, "reduce")
                        recv[src] -= n * _row_bytes(pr, p, kind, "reduce")
        out[p] = (send, recv)
    return out


RELAY_CASES = [{"mask": "causal", "solver": "owner", "stages": 2, "relay": 2},
               {"mask": "causal", "solver": "balanced_bytes", "stages": 1, "relay": 2},
               {"mask": "full_document", "solver": "static", "stages": 2, "relay": 2, "dtype": "bf16"}]


@pytest.mark.parametrize("spec", RELAY_CASES, ids=[f"{s['mask']}-{s['solver']}" for s in RELAY_CASES])
def test_relays_move_the_same_rows_over_other_links(spec):
    """With relays the metrics keep the direct transfers' per-rank send and recv (docs/plan_format.md); the
    wire differs from them by exactly the relays' forwarding (relay_adjustment), and the total is the same."""
    import json
    P = 4
    res = get_pool(P).values("bytes_case", timeout=120, spec=spec)
    assert res[0]["relays"]
    m = res[0]["metrics"]
    adj = relay_adjustment(json.loads(res[0]["plan"]))
    for p in ("fwd", "bwd"):
        assert sum(x[p]["send"] for x in res) == m[p]["total_send"] == sum(m[p]["send"])
        send, recv = adj[p]
        assert any(send), "the plan forwards nothing in this pass"
        for r, x in enumerate(res):
            assert x[p]["send"] == m[p]["send"][r] + send[r], (p, r, x[p], m[p]["send"][r], send[r])
            assert x[p]["recv"] == m[p]["recv"][r] + recv[r], (p, r, x[p], m[p]["recv"][r], recv[r])
