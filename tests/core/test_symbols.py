"""The notation registry (the docstring examples of every memlib module run as doctests: pyproject.toml)."""
from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import sympy as sp

from memlib.config import ConfigError, ModelConfig, TrainingConfig
from memlib.core.symbols import REGISTRY, SYMBOLS, by_field, latex, model_symbols, sym


def test_keys_unique():
    keys = [n.key for n in REGISTRY]
    assert len(keys) == len(set(keys))
    assert list(SYMBOLS) == keys


def test_symbols_and_latex_unique():
    assert len({n.symbol for n in REGISTRY}) == len(REGISTRY)
    assert len({n.latex for n in REGISTRY}) == len(REGISTRY)


def test_model_fields_are_model_config_fields():
    names = {f.name for f in fields(ModelConfig)}
    ms = model_symbols()
    assert ms and all(n.kind == "model" for n in ms)
    for n in ms:
        assert n.field in names, n.key
        assert by_field(n.field) is n
    # every numeric Hugging Face size of the model has a symbol
    assert {n.field for n in ms} >= {
        "hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank",
        "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "num_hidden_layers",
        "first_k_dense_replace", "vocab_size"}


def test_parallel_fields_are_training_config_fields():
    names = {f.name for f in fields(TrainingConfig)}
    for n in REGISTRY:
        if n.kind == "parallel" and n.field is not None:
            assert n.field in names, n.key
    with pytest.raises(KeyError):
        by_field("no_such_field")


def test_assumptions():
    nonneg = {"k_dense", "n_mtp", "L_dense", "L_moe", "P", "P_ne", "P_e", "B_w", "B_g", "B_o"}
    for n in REGISTRY:
        s = n.symbol
        assert isinstance(s, sp.Symbol)
        assert s.is_integer, n.key
        assert s.is_nonnegative, n.key
        if n.key in nonneg:
            assert s.is_positive is None, n.key   # may be zero
        else:
            assert s.is_positive, n.key
    assert sym("h").is_positive and sym("k_dense").is_nonnegative


def test_d_h_and_d_v_distinct():
    assert sym("d_h") != sym("d_v")
    assert sym("d_h").name != sym("d_v").name
    assert SYMBOLS["d_h"].field == "qk_nope_head_dim"
    assert SYMBOLS["d_v"].field == "v_head_dim"
    assert sp.expand(sym("d_h") - sym("d_v")) != 0


def test_latex_and_meaning_non_empty():
    for n in REGISTRY:
        assert n.latex.strip() and n.meaning.strip() and n.unit.strip(), n.key
        assert n.kind in {"model", "parallel", "training", "stage", "precision"}
        # the SymPy name is the LaTeX spelling, so sympy.latex prints the paper's notation; a
        # multi-letter name is upright in LaTeX and plain in SymPy (memlib formula prints DP)
        if n.symbol.name.isalpha() and len(n.symbol.name) > 1:
            assert n.latex == r"\mathrm{" + n.symbol.name + "}", n.key
            assert latex(n.symbol) == n.latex
        else:
            assert n.symbol.name == n.latex


def test_sym_unknown_key():
    with pytest.raises(KeyError):
        sym("nope")


# ---------------------------------------------------------------------------------------------
# multi-letter names in rendered equations (issue 14): CP DP TP must not read "CPDPTP"
# ---------------------------------------------------------------------------------------------
_MULTI = "|".join(sorted((n.symbol.name for n in REGISTRY if n.symbol.name.isalpha() and len(n.symbol.name) > 1),
                         key=len, reverse=True))
#: two names, or a name and a letter, side by side with only a space (which TeX ignores) between them
_RUN_TOGETHER = re.compile(r"\\mathrm\{(?:" + _MULTI + r")\}\s*(?:[A-Za-z]|\\mathrm)"
                           r"|[A-Za-z}]\s+\\mathrm\{(?:" + _MULTI + r")\}"
                           r"|(?<![\\{A-Za-z])(?:" + _MULTI + r")(?![A-Za-z}])")


def run_together(tex: str) -> list[str]:
    """The places of ``tex`` where a multi-letter name touches a neighbouring factor, or is not upright."""
    return _RUN_TOGETHER.findall(tex)


def test_the_checker_sees_a_run_together_product():
    assert run_together(sp.latex(sym("CP") * sym("DP") * sym("TP")))            # "CP DP TP"
    assert run_together(r"\frac{\mathrm{CP} \mathrm{DP}}{2}")
    assert run_together(r"b \mathrm{DP}")
    assert not run_together(r"\frac{\mathrm{CP}\,\mathrm{DP}}{\mathrm{EP}\,\mathrm{ETP}} + n_{MTP}")


def test_products_of_multi_letter_names_are_kept_apart():
    e = sym("CP") * sym("DP") * sym("TP") / (sym("EP") * sym("ETP")) + sym("b") * sym("EDP") * sym("d_h")
    assert latex(e) == (r"\frac{\mathrm{CP}\,\mathrm{DP}\,\mathrm{TP}}{\mathrm{EP}\,\mathrm{ETP}}"
                        r" + \mathrm{EDP}\,b d_{h}")
    assert run_together(latex(e)) == []


def test_no_glued_equation_runs_multi_letter_names_together():
    """Every equation the book glues (the formula registry's LaTeX, each for its example model) sets each
    multi-letter name upright and apart from its neighbours."""
    from memlib.formulas import FORMULAS

    seen = 0
    for f in FORMULAS.values():
        try:
            tex = f.latex()
        except ConfigError:
            continue
        assert run_together(tex) == [], (f.name, tex)
        seen += "mathrm{TP}" in tex
    assert seen >= 5, "the check saw no equation with a parallel size"


def test_memlib_has_one_latex_printer():
    """Every LaTeX memlib prints goes through memlib.core.symbols.latex (no direct sympy.latex elsewhere)."""
    root = Path(__file__).resolve().parents[2] / "memlib"
    direct = [str(p.relative_to(root)) for p in root.rglob("*.py")
              if p.name != "symbols.py" and re.search(r"\b(?:sp|sympy)\.latex\(", p.read_text(encoding="utf-8"))]
    assert direct == []
