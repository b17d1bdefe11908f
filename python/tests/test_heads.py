"""MLA head geometry through the Python Session (docs/heads.md): dim_v and kv_shared reach the planner,
so rows carry their true bytes, and bad geometry is a ValueError naming the key."""
import json

import pytest

import cpsched

Q = [[0, 3000], [3000, 5000], [5000, 8192]]
K = [[0, 3000], [3000, 5000], [5000, 8192]]
T = ["causal", "causal", "full"]

MLA = {"q": 16, "kv": 1, "dim_qk": 576, "dim_v": 512, "kv_shared": True, "dtype": "bf16"}


def session(heads, **kw):
    return cpsched.Session(cp_size=4, heads=heads, solver="owner", cost_model="area", **kw)


def test_mla_heads_reach_the_options_and_the_plan_json():
    s = session(MLA)
    o = s.options
    assert o["heads"] == (16, 1, 576, 2)
    assert o["dim_v"] == 512 and o["kv_shared"] is True
    problem = json.loads(s.solve(Q, K, T).to_json())["problem"]
    assert problem["head_dim"] == 576
    assert problem["head_dim_v"] == 512 and problem["kv_shared"] is True


def test_a_latent_row_moves_d_qk_bytes_once():
    # owner computes every cell on its Q host: only KV moves, a latent row of 576 bf16 per token.
    shared = session(MLA).solve(Q, K, T)
    apart = session(dict(MLA, kv_shared=False)).solve(Q, K, T)
    kv_tokens = shared.metrics["remote_kv_tokens"]
    assert kv_tokens > 0 and shared.metrics["remote_qo_tokens"] == 0
    assert shared.metrics["fwd"]["total_send"] == kv_tokens * 576 * 2
    assert apart.metrics["fwd"]["total_send"] == kv_tokens * (576 + 512) * 2


def test_gqa_tuples_and_dicts_are_unchanged():
    a = json.loads(session((8, 2, 64, "bf16")).solve(Q, K, T).to_json())
    b = json.loads(session({"q": 8, "kv": 2, "dim": 64, "dim_v": 64}).solve(Q, K, T).to_json())
    for doc in (a, b):
        doc["solver"].pop("solve_ms")
    assert a == b
    assert "head_dim_v" not in a["problem"] and "kv_shared" not in a["problem"]


@pytest.mark.parametrize("heads,msg", [
    (dict(MLA, dim=64), "heads: dim_qk = 576 differs from dim = 64"),
    (dict(MLA, dim_v=600), "kv_shared needs dim_v <= dim"),
    (dict(MLA, kv_shared="yes"), "heads['kv_shared']: expected True or False, got 'yes'"),
    (dict(MLA, dim_k=3), "heads: unknown key(s) ['dim_k']"),
])
def test_bad_geometry_is_a_value_error(heads, msg):
    with pytest.raises(ValueError) as e:
        session(heads).solve(Q, K, T)
    assert msg in str(e.value)
