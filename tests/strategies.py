"""Hypothesis strategies: random *valid* models and training configurations of every kind.

A drawn case is a (model config.json mapping, TrainingConfig keyword arguments) pair that memlib must
accept: the sizes are drawn so that every divisibility rule holds (TP divides what it splits, EP the
experts, ETP the expert width, CP and SP the sequence, EP ETP the ranks of a stage), and the layout is
drawn explicitly, one entry per model chunk.  Every profile, precision, recompute policy and schedule
is drawn.
"""
from __future__ import annotations

from hypothesis import strategies as st

from memlib.ledgers.base import POLICIES
from memlib.model.profiles import PROFILES as REGISTRY
from memlib.config.precision import RECIPES

PROFILES = sorted(REGISTRY)
RECIPE_NAMES = sorted(RECIPES)
SCHEDULES = ("gpipe", "1f1b", "interleaved", "dualpipe")


@st.composite
def layouts(draw, layers: int, chunks: int, allow_empty: bool = False):
    """``chunks`` non-negative layer counts summing to ``layers`` (positive unless ``allow_empty``)."""
    if not allow_empty:
        cuts = sorted(draw(st.lists(st.integers(1, layers - 1), min_size=chunks - 1, max_size=chunks - 1,
                                    unique=True))) if chunks > 1 else []
    else:
        cuts = sorted(draw(st.lists(st.integers(0, layers), min_size=chunks - 1, max_size=chunks - 1)))
    bounds = [0, *cuts, layers]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


@st.composite
def cases(draw, profiles=PROFILES, schedules=SCHEDULES, policies=None, recipes=RECIPE_NAMES, max_layers: int = 6,
          room: int = 1):
    """A valid (model dict, training kwargs) pair; with ``room`` = k the widths TP splits and the
    experts EP splits stay divisible when TP or EP grow k-fold (for the monotonicity properties)."""
    profile = draw(st.sampled_from(profiles))
    parallel = profile != "hf-eager"
    tp = draw(st.sampled_from((1, 2, 4))) if parallel else 1
    cp = draw(st.sampled_from((1, 2))) if parallel else 1
    ep = draw(st.sampled_from((1, 2, 4))) if parallel else 1
    etp = draw(st.sampled_from((1, 2))) if parallel else 1
    mult = lambda lo, hi, k: k * room * draw(st.integers(lo, hi))  # noqa: E731 - a width that k divides
    n_layers = draw(st.integers(1, max_layers))
    schedule = draw(st.sampled_from(schedules))
    pp = draw(st.sampled_from((1, 2, 4)))
    if schedule == "dualpipe":
        pp = draw(st.sampled_from((2, 4)))
    vpp = draw(st.sampled_from((2, 3))) if schedule == "interleaved" else 1
    n_layers = max(n_layers, pp * vpp)          # every model chunk gets at least one layer
    n_experts = ep * room * draw(st.integers(1, 4))
    d = {
        "hidden_size": mult(2, 8, tp * 2),
        "intermediate_size": mult(1, 6, tp * 2),
        "moe_intermediate_size": mult(1, 4, etp * 2 * tp),
        "num_attention_heads": mult(1, 3, tp),
        "qk_nope_head_dim": draw(st.integers(1, 6)),
        "qk_rope_head_dim": 2 * draw(st.integers(1, 3)),
        "v_head_dim": draw(st.integers(1, 6)),
        "q_lora_rank": draw(st.one_of(st.none(), st.integers(2, 12))),
        "kv_lora_rank": draw(st.integers(2, 12)),
        "n_routed_experts": n_experts,
        "n_shared_experts": draw(st.integers(0, 2)),
        "num_experts_per_tok": draw(st.integers(1, n_experts)),
        "num_hidden_layers": n_layers,
        "first_k_dense_replace": draw(st.integers(0, n_layers)),
        "moe_layer_freq": draw(st.sampled_from((1, 1, 2))),
        "vocab_size": mult(2, 16, tp),
        "num_nextn_predict_layers": draw(st.integers(0, 2)),
        "tie_word_embeddings": draw(st.booleans()),
        "topk_method": draw(st.sampled_from(("noaux_tc", "greedy"))),
    }
    if profile == "hf-eager":
        d["moe_layer_freq"] = 1
    dp = ep * etp * draw(st.sampled_from((1, 2)))          # EP ETP divides DP TP CP
    seq = cp * tp * draw(st.integers(1, 6))
    if policies is None:
        modules = sorted(REGISTRY[profile].activations.modules)
        policy = draw(st.one_of(
            st.sampled_from(sorted(POLICIES)),
            st.integers(1, 3).map(lambda k: f"full-block:{k}"),
            st.lists(st.sampled_from(modules), min_size=1, max_size=3, unique=True).map(",".join)))
        if policy == "deepseek" and "mla_up_proj" not in modules:
            policy = "selective"
    else:
        policy = draw(st.sampled_from(policies))
    m = None
    if schedule == "gpipe":
        m = draw(st.integers(1, 6))
    elif schedule == "interleaved":
        m = draw(st.sampled_from((None, pp, 2 * pp)))
    elif schedule == "dualpipe":
        m = draw(st.sampled_from((None, 2 * pp, 2 * pp + 2)))
    else:
        m = draw(st.sampled_from((None, 1, pp, 3 * pp)))
    train = dict(
        dp=dp, tp=tp, pp=pp, ep=ep, etp=etp, cp=cp, sp=draw(st.booleans()) if tp > 1 else True,
        layout=draw(layouts(n_layers, pp * vpp)),
        zero=draw(st.integers(0, 3)), precision=draw(st.sampled_from(recipes)), profile=profile,
        micro_batch=draw(st.integers(1, 3)), seq_len=seq, recompute=policy, schedule=schedule,
        num_microbatches=m, vpp=vpp,
    )
    return d, train
