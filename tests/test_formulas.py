"""memlib formula: every named formula builds, equals memlib's own results, and the CLI prints it."""
import subprocess
import sys

import pytest
import sympy as sp

from memlib.config import ConfigError, load_model
from memlib.formulas import FORMULAS, formula
from memlib.model.params import values
from memlib.core.symbols import sym


@pytest.mark.parametrize("name", sorted(FORMULAS))
def test_every_formula_builds_symbolically(name):
    f = FORMULAS[name]
    tex = f.latex()
    assert tex and "\t" not in tex.replace("\\t", "")          # no TAB from a non-raw "\text"
    if isinstance(f.build(), str):                               # an equation of the architecture: LaTeX only
        with pytest.raises(ConfigError, match="has LaTeX only"):
            formula(name)
        return
    e = formula(name)
    assert isinstance(e, sp.Expr) and e.free_symbols, name
    # the plain text names every block it uses in plain letters
    assert "\\mathrm" not in f.text()


def test_book_numbers_are_sequential_per_chapter():
    from memlib.formulas import book_formulas

    by_chapter = {}
    for f in book_formulas():
        ch, i = map(int, f.number.split("."))
        by_chapter.setdefault(ch, []).append(i)
    assert all(ns == list(range(1, len(ns) + 1)) for ns in by_chapter.values()), by_chapter


def test_formulas_evaluate_to_the_papers_numbers():
    v3 = values(load_model("deepseek-v3"))
    assert formula("params.mla").xreplace(v3) == 187_107_328
    assert formula("params.moe_layer").xreplace(v3) == 11_507_286_016
    assert formula("params.total").xreplace(v3) == 671_026_404_352
    assert formula("params.activated").xreplace(v3) == 37_552_282_624
    paper = {**v3, sym("b"): 1, sym("s"): 4096, sym("TP"): 2, sym("CP"): 1, sym("EP"): 8, sym("ETP"): 1}
    # four layers of stage 1 (the paper's Table 10 with b = 1)
    assert 4 * (formula("activations.paper.mla") + formula("activations.paper.moe")).xreplace(paper) == 24_671_158_272
    assert 4 * (formula("activations.paper.mla_full") + formula("activations.paper.moe_full")).xreplace(paper) == 235_143_168


def test_formula_follows_the_model_structure():
    # V2-Lite has no q compression: no d_c' in its MLA count
    assert sym("d_cq") not in formula("params.mla", "deepseek-v2-lite").free_symbols
    assert sym("d_cq") in formula("params.mla", "deepseek-v3").free_symbols


def test_unknown_formula_is_a_config_error():
    with pytest.raises(ConfigError, match="formula='nope' is unknown"):
        formula("nope")


def test_cli_formula():
    run = lambda *a: subprocess.run([sys.executable, "-m", "memlib", "formula", *a],  # noqa: E731
                                    capture_output=True, text=True)
    from memlib.formulas import equation

    r = run("params.expert", "--latex")
    assert r.returncode == 0 and r.stdout.strip() == r"P_{\mathrm{expert}} = 3 h h_{E}" == equation("params.expert")
    r = run("params.total")
    assert r.returncode == 0 and r.stdout.strip().startswith("P_total = ")
    r = run("params.total", "--expand")
    assert r.returncode == 0 and r.stdout.strip() == sp.sstr(formula("params.total"))
    assert formula("params.total").xreplace(values(load_model("deepseek-v3"))) == 671_026_404_352
    r = run()
    assert r.returncode == 0 and "states.zero1" in r.stdout and "(3.6)  params.total" in r.stdout
    r = run("nope")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v2", "deepseek-v2-lite"])
def test_total_is_the_books_form_and_memlibs_count(model):
    """params.total is eq. (3.6): each block written once (no k_dense / l - k_dense copies of every
    tensor), and exactly memlib's count."""
    from memlib.model.params import model_params

    m = load_model(model)
    e = formula("params.total", m)
    assert sp.expand(e - model_params(m).total) == 0
    text = sp.sstr(e)
    assert text.count("k_{dense}") == 2           # k P_FFN and (l - k) P_MoE, once each
    assert text.count("h_F") == 1 and text.count("h_E") == 2   # the dense FFN once, shared and routed experts once
    assert len(text) < 300


def test_a_block_the_model_lacks_has_zero_parameters(tmp_path):
    import tiny as T

    p = T.write_tiny(tmp_path / "config.json", n_shared_experts=0)
    assert formula("params.shared_experts", load_model(str(p))) == 0
    r = subprocess.run([sys.executable, "-m", "memlib", "formula", "params.shared_experts", "--model", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "P_shared = 0" and r.stderr == ""


# ------------------------------------------------------------------------------------------------
# every architecture (issue 12): the formulas follow the model's block kinds, and evaluated they are
# estimate()'s exact integers, on every preset and on random tiny configs of each family
# ------------------------------------------------------------------------------------------------
import random  # noqa: E402

from memlib import estimate  # noqa: E402
from memlib.config import PRESETS, TrainingConfig, model_from_dict  # noqa: E402
from memlib.model.params import activated_params, model_params, mtp_params  # noqa: E402
from memlib.model.partition import Partition  # noqa: E402

_ENDS = ("embedding", "head", "final_norm", "mtp")


def _check_against_estimate(m, train: TrainingConfig) -> None:
    """params.total, params.activated, params.mtp; per-device static (4.7) on each stage of one layer kind;
    the per-layer activations (6.5, 6.6) against the estimate's evaluated ledger; all exact integers."""
    vals = values(m)
    assert formula("params.total", m).xreplace(vals) == model_params(m).evaluate_total(vals)
    assert formula("params.readable_total", m).xreplace(vals) == model_params(m).evaluate_total(vals)
    assert formula("params.activated", m).xreplace(vals) == activated_params(m).evaluate_total(vals)
    assert formula("params.mtp", m).xreplace(vals) == mtp_params(m).evaluate_total(vals)
    est = estimate(m, train)
    part: Partition = est.partition
    checked = 0
    kind = "moe" if m.has_moe else "dense"            # eq. (4.7) is a stage of MoE layers (a dense model's)
    for st in part.stages:
        if {m.layer_kinds[i] for i in st.layers} != {kind}:
            continue
        own = part.params(st).select(lambda k: k.split(".")[0] not in _ENDS).evaluate_total(part.values)
        n = {sym("L_moe"): len(st.layers), sym("L_dense"): len(st.layers), sym("TP"): train.tp,
             sym("EP"): train.ep, sym("ETP"): train.etp}
        assert formula("static.device", m, train).xreplace({**part.values, **n}) == own, (m.name, st.index)
        checked += 1
    assert checked or kind not in m.layer_kinds
    led = est._evaluated(f"layer.{kind}")
    for block, name in (("attention", "mla_config"), ("moe" if m.has_moe else "dense_ffn", "moe_config")):
        want = sum(x for k, (x, e) in led.items() if e.block == block)
        got = formula(f"activations.paper.{name}", m, train).xreplace({**vals, sym("b"): train.micro_batch,
                                                                      sym("s"): train.seq_len})
        assert got == want, (m.name, block)


#: one preset of each structure (the others of a family differ in sizes only, which stay symbols)
STRUCTURES = ("deepseek-v2-lite", "llama-3-8b", "mixtral-8x7b", "qwen3-30b-a3b")


@pytest.mark.parametrize("preset", STRUCTURES)
def test_every_formula_builds_for_every_structure(preset):
    """``memlib formula`` answers for every preset: a count for every formula, and MLA's equations only
    for an MLA model, the query latent's only for one that compresses its queries (a one-line ConfigError for the
    others)."""
    m = load_model(preset)
    for name, f in FORMULAS.items():
        needs = f.attention or ("mla" if name.startswith("mla.") else None)
        if needs and m.attention != needs:
            with pytest.raises(ConfigError, match=f"formula={name} is an equation of "):
                f.latex(m)
            continue
        if name == "mla.cq" and m.q_lora_rank is None:
            with pytest.raises(ConfigError, match="formula=mla.cq: .* compresses no query"):
                f.latex(m)
            continue
        assert f.latex(m) and f.text(m)
        if not isinstance(f.build(m), str):
            formula(name, m)


@pytest.mark.parametrize("preset", PRESETS)
def test_formulas_are_estimates_integers_on_every_preset(preset):
    from memlib.paper import paper_training

    m = load_model(preset)
    t = paper_training(m)
    _check_against_estimate(m, t.with_(pp=2, layout=None, dp=t.ep, seq_len=1024))


def test_formulas_equal_the_published_totals():
    """The attention and FFN formulas of another architecture, evaluated: transformers' counts."""
    from test_architectures import PRESET_TOTALS

    for name, total in PRESET_TOTALS.items():
        m = load_model(name)
        assert formula("params.total", m).xreplace(values(m)) == total, name


def test_formulas_name_the_block_the_model_has():
    from memlib.formulas import equation, equation_text

    assert equation("params.mla", "llama-3-8b").startswith(r"P_{\mathrm{GQA}} = ")
    assert equation_text("params.mla", "deepseek-v3").startswith("P_MLA = ")
    # Llama's attention by hand: W^Q, W^O (n_h d_head x h) and W^K, W^V (n_kv d_head x h)
    h, n_h, n_kv, d = sym("h"), sym("n_h"), sym("n_kv"), sym("d_head")
    assert sp.expand(formula("params.mla", "llama-3-8b") - 2 * h * d * (n_h + n_kv)) == 0
    # Qwen3 adds the two head RMSNorms of d_head each
    assert sp.expand(formula("params.mla", "qwen3-30b-a3b") - 2 * h * d * (n_h + n_kv) - 2 * d) == 0
    # a dense model: no MoE block, every parameter activated, its FFN per device in eq. 4.6
    assert formula("params.moe", "llama-3-8b") == 0 and formula("params.expert", "llama-3-8b") == 0
    assert sp.expand(formula("params.activated", "llama-3-8b") - formula("params.total", "llama-3-8b")) == 0
    assert equation_text("static.moe", "llama-3-8b").startswith("P_FFN = L^{dense}_{st}*")
    assert equation_text("activations.paper.moe", "llama-3-8b").startswith("M^F_device = ")
    # Mixtral: router and routed experts, no shared expert; one expert is a SwiGLU of width h_E
    assert formula("params.shared_experts", "mixtral-8x7b") == 0
    assert formula("params.expert", "mixtral-8x7b") == 3 * h * sym("h_E")
    r = subprocess.run([sys.executable, "-m", "memlib", "formula", "mla.q", "--model", "llama-3-8b"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "GQA attention" in r.stderr


def _random_gpt(r: random.Random) -> dict:
    n_h = r.randint(1, 4)
    return {"model_type": "gpt", "hidden_size": n_h * r.randint(1, 6), "num_attention_heads": n_h,
            "num_hidden_layers": r.randint(1, 3), "max_position_embeddings": r.randint(4, 40),
            "vocab_size": r.randint(10, 60), "intermediate_size": r.randint(4, 40),
            "attention_bias": r.random() < 0.7, "mlp_bias": r.random() < 0.7}


@pytest.mark.parametrize("family", ["llama", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "gpt2", "gpt", "deepseek"])
def test_formulas_are_estimates_integers_on_random_tiny_configs(family):
    """Property: on random tiny configs of each family and random parallel sizes that divide them, every
    formula evaluated is estimate()'s exact integer."""
    import tiny as T
    from test_architectures import _random

    r = random.Random(f"issue-12-formulas-{family}")
    for _ in range(4):
        if family == "deepseek":
            m = T.tiny(num_hidden_layers=r.randint(1, 4), first_k_dense_replace=r.randint(0, 1),
                       n_shared_experts=r.randint(0, 2))
        else:
            m = model_from_dict(_random_gpt(r) if family == "gpt" else _random(family, r), name=f"tiny-{family}")
        train = TrainingConfig(dp=2, tp=r.choice([1, 2]), ep=r.choice([1, 2]) if m.has_moe else 1, pp=r.choice([1, 2]),
                               micro_batch=r.randint(1, 2), seq_len=r.choice([4, 6, 8]), sp=r.random() < 0.5)
        try:
            estimate(m, train)
        except ConfigError:                     # TP or EP does not divide a width, or too few layers for PP
            train = train.with_(tp=1, ep=1, pp=1)
        _check_against_estimate(m, train)
