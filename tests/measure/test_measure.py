"""Ground truth: memlib against the pinned transformers implementation (memlib.measure.hf).

The validation needs the optional extra (``pip install memlib[measure]``: torch and transformers);
without it those tests are skipped, with the reason, and the rest of the suite runs.

* Parameters: the three presets built on the meta device, per tensor, per block and in total.
* Activations: the ``hf-eager`` ledger against autograd's saved tensors, to the byte, per decoder
  layer, embedding, final norm, head and loss, on random small configs drawn fresh on every run
  (the seed is printed on failure; ``MEMLIB_MEASURE_SEED=...`` replays it,
  ``MEMLIB_MEASURE_CONFIGS=...`` draws more).
"""
from __future__ import annotations

import json
import os
import random
import sys

import pytest

from memlib.cli import main
from memlib.config import load_model
from memlib.measure.hf import MISSING_EXTRA

from tiny import tiny as _tiny, write_tiny

#: the tiny model with h_E = 8: transformers' grouped_mm experts need 16-byte strides in bf16


def tiny(**kw):
    return _tiny(**{"moe_intermediate_size": 8, **kw})

SKIP_REASON = "memlib[measure] (torch, transformers) not installed: ground-truth validation skipped"
N_CONFIGS = int(os.environ.get("MEMLIB_MEASURE_CONFIGS", "50"))


@pytest.fixture(scope="module")
def extra():
    """Skips without the extra; under CI (``CI=true``, where `make venv` installs it) fails instead."""
    if os.environ.get("CI", "").lower() in ("1", "true"):
        import torch  # noqa: F401
        import transformers  # noqa: F401
        return
    pytest.importorskip("torch", reason=SKIP_REASON)
    pytest.importorskip("transformers", reason=SKIP_REASON)


def _seed() -> int:
    env = os.environ.get("MEMLIB_MEASURE_SEED")
    return int(env) if env else int.from_bytes(os.urandom(4), "little")


def _describe(m, b, s) -> str:
    fields = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank", "n_routed_experts",
              "n_shared_experts", "num_experts_per_tok", "num_hidden_layers", "first_k_dense_replace", "vocab_size")
    return f"b={b} s={s} " + json.dumps({f: getattr(m, f) for f in fields})


# ------------------------------------------------------------------------------------------------
# without the extra
# ------------------------------------------------------------------------------------------------
def test_measure_without_the_extra_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)     # import torch now raises ImportError
    assert main(["measure", "--model", "deepseek-v3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"memlib: error: {MISSING_EXTRA}"
    assert "pip install memlib[measure]" in err


def test_hf_eager_profile_is_registered_without_torch():
    from memlib.config import TrainingConfig
    from memlib.device.estimate import estimate

    t = TrainingConfig(profile="hf-eager", micro_batch=2, seq_len=8, num_microbatches=1)
    st = estimate(tiny(), t).stages[0]
    assert st.activations["per_microbatch"] > 0
    assert not any(k.startswith("mtp.") for k in st.activations["by_entry"])


def test_hf_eager_b1_view_cases():
    """b = 1 keeps the whole kv_b_proj output (V is a view) and the padded labels (s + 1)."""
    from memlib.ledgers.base import ledger_bytes
    from memlib.ledgers import act_profile
    from memlib.model.params import values
    from memlib.core.symbols import sym

    m = tiny()
    ap = act_profile("hf-eager")
    value = next(e for e in ap.layer(m, "dense") if e.key == "attention.value")
    labels = next(e for e in ap.head(m) if e.key == "loss.labels")
    vals = values(m)
    b, s = sym("b"), sym("s")
    n_h, d_h, d_v = m.num_attention_heads, m.qk_nope_head_dim, m.v_head_dim
    assert value.elements.xreplace({**vals, b: 1, s: 7}) == 7 * n_h * (d_h + d_v)
    assert value.elements.xreplace({**vals, b: 2, s: 1}) == 2 * n_h * (d_h + d_v)
    assert value.elements.xreplace({**vals, b: 2, s: 7}) == 14 * n_h * d_v
    assert labels.elements.xreplace({b: 1, s: 7}) == 8 and labels.elements.xreplace({b: 3, s: 7}) == 21
    assert ledger_bytes(ap.head(m)).evaluate({**vals, b: 1, s: 7})["loss.total_weight"] == 4


# ------------------------------------------------------------------------------------------------
# parameters: the presets at full size, on the meta device
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset,cls", [("deepseek-v3", "DeepseekV3ForCausalLM"),
                                        ("deepseek-v2", "DeepseekV2ForCausalLM"),
                                        ("deepseek-v2-lite", "DeepseekV2ForCausalLM")])
def test_preset_parameters_match_transformers_exactly(extra, preset, cls):
    from memlib.measure.hf import param_check

    r = param_check(preset)
    assert r["class"] == cls
    bad = [row for row in r["tensors"] if not row["ok"]]
    assert not bad, bad[:5]
    assert all(v["memlib"] == v["transformers"] for v in r["blocks"].values()), r["blocks"]
    assert r["total"]["memlib"] == r["total"]["transformers"]
    assert r["buffers"]["memlib"] == r["buffers"]["transformers"]
    assert r["ok"]


def test_router_bias_is_a_buffer_in_transformers(extra):
    from memlib.measure.hf import param_check

    r = param_check("deepseek-v3")
    rows = [row for row in r["tensors"] if row["hf"].endswith("e_score_correction_bias")]
    m = load_model("deepseek-v3")
    assert len(rows) == m.layer_kinds.count("moe")
    assert all(row["transformers_buffer"] and row["memlib_buffer"] for row in rows)
    assert r["buffers"]["transformers"] == m.layer_kinds.count("moe") * m.n_routed_experts


# ------------------------------------------------------------------------------------------------
# activations: the hf-eager ledger against autograd
# ------------------------------------------------------------------------------------------------
def test_tiny_model_exact_with_gradients_and_adamw(extra):
    from memlib.measure.hf import compare

    for b, s in ((1, 1), (1, 6), (2, 1), (3, 5)):
        r = compare(tiny(), b, s)
        assert r["exact"], (b, s, r["regions"], r.get("gradients"), r.get("optimizer_states"))
        assert [x["region"] for x in r["regions"]] == ["embedding", "layer.0", "layer.1", "layer.2",
                                                         "final_norm", "head", "loss"]


def test_random_configs_exact(extra):
    from memlib.measure.hf import compare
    from memlib.measure.random_configs import random_config

    seed = _seed()
    rng = random.Random(seed)
    failures = []
    for i in range(N_CONFIGS):
        m, b, s = random_config(rng)
        r = compare(m, b, s, seed=i, step=(i % 5 == 0))
        if not r["exact"]:
            diff = [x for x in r["regions"] if x["difference"]] + [
                {k: r[k]} for k in ("gradients", "optimizer_states") if k in r and r[k]["difference"]]
            failures.append(f"config {i}: {_describe(m, b, s)} -> {diff}")
    assert not failures, (f"MEMLIB_MEASURE_SEED={seed}: {len(failures)} of {N_CONFIGS} random configs "
                          f"not exact:\n" + "\n".join(failures))


def test_estimate_reports_the_ledger_prediction(extra, tmp_path, capsys):
    """`memlib estimate --profile hf-eager` on one device gives the measured bytes as per_microbatch."""
    from memlib.measure.hf import measure_activations
    from memlib.measure.random_configs import random_config

    seed = _seed()
    m, b, s = random_config(random.Random(seed))
    cfg = {f: getattr(m, f) for f in ("hidden_size", "intermediate_size", "moe_intermediate_size",
                                      "num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                      "q_lora_rank", "kv_lora_rank", "n_routed_experts", "n_shared_experts",
                                      "num_experts_per_tok", "num_hidden_layers", "first_k_dense_replace",
                                      "vocab_size")}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**cfg, "model_type": "deepseek_v3"}))
    assert main(["estimate", "--model", str(path), "--dp", "1", "--tp", "1", "--pp", "1", "--ep", "1", "--etp", "1",
                 "--zero", "0", "--profile", "hf-eager", "--micro-batch", str(b), "--seq-len", str(s),
                 "--recompute", "none", "--num-microbatches", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    measured = measure_activations(path, b, s, step=False).total
    assert data["stages"][0]["activations"]["per_microbatch"] == measured, f"MEMLIB_MEASURE_SEED={seed}"


def test_cli_measure_text_and_json(extra, tmp_path, capsys):
    path = write_tiny(tmp_path / "config.json", model_type="deepseek_v3", moe_intermediate_size=8)
    assert main(["measure", "--model", str(path), "--micro-batch", "2", "--seq-len", "4"]) == 0
    out = capsys.readouterr().out
    assert "layer.2" in out and "total" in out and out.rstrip().endswith("exact")
    assert main(["measure", "--model", str(path), "--micro-batch", "1", "--seq-len", "3", "--json",
                 "--no-step"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["exact"] and data["activations"]["difference"] == 0
    assert "gradients" not in data


def test_cli_measure_refuses_a_full_size_model(extra, capsys):
    assert main(["measure", "--model", "deepseek-v3"]) == 2
    assert "meta device" in capsys.readouterr().err


def test_cli_measure_names_the_grouped_mm_rule(extra, tmp_path, capsys):
    path = write_tiny(tmp_path / "config.json", model_type="deepseek_v3")     # h_E = 4
    assert main(["measure", "--model", str(path)]) == 2
    assert "multiples of 8" in capsys.readouterr().err


def test_saved_tensor_accounting_counts_storages_once(extra):
    """A tensor saved twice, and two views of one tensor, are one storage each; parameters are not
    counted; each storage goes to the region that saved it first."""
    import torch

    from memlib.measure.hf import SavedTensors

    w = torch.nn.Parameter(torch.ones(8, 8))
    x = torch.ones(8, 4, requires_grad=True)
    where = ["a"]
    key = (w.untyped_storage().data_ptr(), w.untyped_storage().nbytes(), "cpu")
    saved = SavedTensors(exclude={key}, region=lambda: where[0])
    with saved.hooks():
        y = x * x                                # mul saves x twice: one storage, 8 * 4 fp32
        where[0] = "b"
        z = y.view(4, 8) * y.view(4, 8)          # two views of y: one storage
        where[0] = "c"
        u = (z @ w).sum()                        # saves z (new) and w (a parameter, excluded)
    got = [(d["region"], d["bytes"]) for d in saved.storages()]
    assert got == [("a", 128), ("b", 128), ("c", 128)]
    assert u.requires_grad


def test_measured_regions(extra):
    from memlib.measure.hf import measure_activations

    meas = measure_activations(tiny(), 2, 3, step=False)
    assert set(meas.regions) == {"embedding", "layer.0", "layer.1", "layer.2", "final_norm", "head", "loss"}
