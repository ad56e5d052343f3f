"""plan's step-time model (memlib.search.cost) against SimuMax's 43 measured Megatron-LM runs on B200, its links
against Megatron-Core's own rank generator, and its terms on hand-worked cases."""
from __future__ import annotations

import ast
import importlib.util
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from memlib.config import TrainingConfig
from memlib.data.reference import SIMUMAX_B200_STEPS
from memlib.scenarios import steps
from memlib.search.cost import EFFICIENCY, GPUS, NCCL, TIE_BAND, CostModel, collective_s, spans_nodes
from memlib.search.plan import step_cost


def test_the_measured_runs_are_ordered_as_measured():
    """The issue's targets: >= 35 of the pairs whose measured throughputs differ by >= 2 % in the measured order,
    Spearman >= 0.8 per model, predicted/measured within 1.3x across each group."""
    v = steps.validation()
    assert len(SIMUMAX_B200_STEPS) == 43 and len(v.pairs(0.0)) == 45 and len(v.pairs(steps.THRESHOLD)) == 39
    assert v.right >= 35, [(a.run["case"], b.run["case"]) for a, b, ok in v.pairs(steps.THRESHOLD) if not ok]
    assert min(v.spearman().values()) >= 0.8, v.spearman()
    assert max(v.spread().values()) <= 1.3, v.spread()
    print(f"pairs {v.right}/{v.right + v.wrong}; Spearman {v.spearman()}; spread {max(v.spread().values()):.3f}")


def test_the_calibrated_efficiency_and_the_tie_band_are_the_data_s():
    """EFFICIENCY["B200"] is the least-squares fit on the measured runs (to its two decimals) and TIE_BAND the median
    pairwise error at it: neither is typed from elsewhere."""
    assert EFFICIENCY["B200"] == pytest.approx(steps.calibrate(), abs=0.005)
    assert TIE_BAND == pytest.approx(steps.tie_band(), abs=0.005)


def test_a_link_is_what_megatron_core_builds():
    """spans_nodes against Megatron-Core's RankGenerator (its source, read from the installed megatron-core: the
    package itself needs a GPU stack to import): every group of the dense and the expert grid of 8, 64 and 256 GPUs
    in nodes of 8 stays in a node exactly when spans_nodes says so."""
    spec = importlib.util.find_spec("megatron.core")
    src = Path(spec.submodule_search_locations[0], "parallel_state.py").read_text()
    keep = [n for n in ast.parse(src).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
            and n.name in ("generate_masked_orthogonal_rank_groups", "RankGenerator")]
    ns: dict = {"List": list}
    exec(compile(ast.Module(keep, []), "parallel_state", "exec"), ns)
    gen = ns["RankGenerator"]
    node, checked = 8, 0
    for n, tp, cp, pp, etp, ep in itertools.product((8, 64, 256), (1, 2, 4, 8, 16), (1, 2, 4), (1, 2, 8),
                                                    (1, 2, 4), (1, 4, 8, 32)):
        if n % (tp * cp * pp) or (n // pp) % (etp * ep):
            continue
        dp, edp = n // (tp * cp * pp), n // (pp * etp * ep)
        dense = gen(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
        expert = gen(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
        for g, name, stride, size in ((dense, "tp", 1, tp), (dense, "cp", tp, cp), (dense, "dp-cp", tp, dp * cp),
                                      (dense, "pp", n // pp, pp), (expert, "ep", etp, ep), (expert, "tp", 1, etp),
                                      (expert, "dp", etp * ep, edp)):
            inside = all(len({r // node for r in ranks}) == 1 for ranks in g.get_ranks(name))
            assert inside == (not spans_nodes(stride, size, node)), (name, n, tp, cp, pp, etp, ep)
            checked += 1
    assert checked > 2000


def test_a_collective_by_hand():
    """An all-gather of 1 GB over 8 ranks of NVLink (B200): 7/8 GB at 900 GB/s x eta, plus 7 step latencies and the
    fixed one; a group of one rank costs nothing."""
    c = NCCL["all_gather"]
    want = c.fixed_s + 7 * c.step_s + 7 / 8 * 1e9 / (900e9 * c.eta)
    assert float(collective_s("all_gather", 1e9, 8, GPUS["B200"].nvlink)) == pytest.approx(want)
    assert float(collective_s("all_gather", 1e9, 1, GPUS["B200"].nvlink)) == 0.0


def _llama(layers=4, tp=1):
    from memlib.scenarios.measured import simumax_model
    return simumax_model("llama3-70b", layers, tp)


def test_the_compute_term_by_hand():
    """One GPU, no parallelism: the compute term is 3 x (2 x every parameter + the causal attention core per layer
    + 2 h V logits) x tokens / (peak x efficiency); nothing else but the optimizer step."""
    m = _llama(2)
    from memlib.model.params import model_params, values
    # the embedding is a lookup and the final norm element-wise: neither is a GEMM
    p = model_params(m).evaluate_total(values(m)) - m.vocab_size * m.hidden_size - m.hidden_size
    s, M = 4096, 3
    fwd = 2 * p + m.num_hidden_layers * s * m.num_attention_heads * 2 * m.head_dim

    cost = CostModel.of("B200", efficiency=0.5)
    t = step_cost(m, TrainingConfig(profile="megatron", precision="megatron", seq_len=s, num_microbatches=M), cost)
    assert t["compute_s"] == pytest.approx(M * 3 * fwd * s / (2250e12 * 0.5), rel=1e-12)
    assert t["tp_s"] == t["ep_s"] == t["cp_s"] == t["pp_s"] == t["dp_s"] == t["bubble_s"] == 0
    assert t["step_s"] == pytest.approx(t["compute_s"] + t["optimizer_s"])


def test_terms_move_the_way_their_mechanisms_say():
    """TP8 across two nodes of four pays the network; ZeRO-3 gathers every micro-batch (more micro-batches, more
    time) where ZeRO-1 synchronises once; a pipeline's bubble falls with M; the p2p ring's keys and values shrink with
    grouped-query heads."""
    m = _llama(8, 8)
    base = TrainingConfig(profile="megatron", precision="megatron", tp=8, num_microbatches=4)
    fat, thin = CostModel.of("H100"), CostModel.of("H100", gpus_per_node=4)
    assert step_cost(m, base, thin)["tp_s"] > 5 * step_cost(m, base, fat)["tp_s"] > 0
    m1 = _llama(8, 1)
    z = TrainingConfig(profile="megatron", precision="megatron", dp=8, zero=1, num_microbatches=2)
    slow = CostModel.of("H100", nvlink=10e9)         # ZeRO-3's gathers then outlast the compute they hide behind
    d1 = [step_cost(m1, z.with_(num_microbatches=k), slow)["dp_s"] for k in (2, 8)]
    d3 = [step_cost(m1, z.with_(zero=3, num_microbatches=k), slow)["dp_s"] for k in (2, 8)]
    assert d1[0] == d1[1] and d3[1] == pytest.approx(4 * d3[0]) and d3[0] > 0
    pp = TrainingConfig(profile="megatron", precision="megatron", pp=4, num_microbatches=4)
    assert step_cost(m1, pp)["bubble"] == pytest.approx(3 / 4)
    assert step_cost(m1, pp.with_(num_microbatches=16))["bubble"] == pytest.approx(3 / 16)
    cp = TrainingConfig(profile="megatron", precision="megatron", cp=8, seq_len=8 * 4096, num_microbatches=1)
    low = CostModel.of("H100", network=1e9, gpus_per_node=1)          # every CP exchange over a slow link
    assert step_cost(m1, cp, low)["cp_s"] > 0
    kv = 2 * m1.num_key_value_heads * m1.head_dim * 2                 # bytes of one token's keys and values
    assert step_cost(m1, cp, low)["cp_bytes"] == pytest.approx(8 * 3 * 7 / 8 * 8 * 4096 * kv)


def test_the_baseline_it_replaces():
    """Issue 23's starting point, measured: the former cost (step_s from FLOPs at 100 % of peak, DP and PP on the
    network) ordered 19 of the 45 pairs (B200 constants); the model now orders at least 42 of them."""
    v = steps.validation()
    assert sum(ok for *_, ok in v.pairs(0.0)) >= 42
    assert math.isclose(sum(1 for _ in v.pairs(0.0)), 45)
    assert np.isfinite([r.predicted_s for r in v.rows]).all()
