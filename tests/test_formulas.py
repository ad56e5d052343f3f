"""memlib formula: every named formula builds, equals memlib's own results, and the CLI prints it."""
import subprocess
import sys

import pytest
import sympy as sp

from memlib.config import ConfigError, load_model
from memlib.formulas import FORMULAS, formula
from memlib.params import values
from memlib.symbols import sym


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
    from memlib.params import model_params

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
