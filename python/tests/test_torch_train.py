"""The training example (examples/torch/train_packed.py), shortened: 4 ranks under torchrun on gloo, both
layouts, losses equal to the single-process run's within 1e-4."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "torch", "train_packed.py")


@pytest.mark.parametrize("layout", ["sequential", "planned"])
def test_example_losses_equal_the_single_process_run(layout, tmp_path):
    if not os.path.exists(EXAMPLE):
        pytest.skip("examples/torch/train_packed.py is not beside the tests")
    out = tmp_path / "losses.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
           EXAMPLE, "--steps", "4", "--layout", layout, "--check", "--json", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    assert len(res["distributed"]) == 4 and res["max_abs_diff"] <= 1e-4
    assert res["distributed"][-1] < res["distributed"][0]  # it trains
    if layout == "planned":
        assert res["dispatched_steps"] >= 3, res  # the loader's plans really laid the tokens out anew


def test_dsa_layer_example_matches_one_dense_process(tmp_path):
    """examples/torch/dsa_layer.py: 3 ranks, each with only its own top-k rows, planned and written on the
    indices' device; out, dq and dkv equal a dense single-process layer within 1e-5 (the example's --check)."""
    example = os.path.join(ROOT, "examples", "torch", "dsa_layer.py")
    if not os.path.exists(example):
        pytest.skip("examples/torch/dsa_layer.py is not beside the tests")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3", example,
           "--tokens-per-rank", "48", "--topk", "12", "--check"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=str(tmp_path))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "max |distributed - dense|" in p.stdout and p.stdout.count("written on cpu") == 3, p.stdout[-3000:]
