"""The Validation chapter's module: every table, figure and value for DeepSeek-V3, DeepSeek-V2 and
DeepSeek-V2-Lite, no DeepSeek-V3 number in another model's results, and every glue key the prose
uses glued by the chapter's cells.

Needs the measure extra and megatron-core (the chapter measures the model in miniature); without
them the tests are skipped, and under CI (``CI=true``) they fail instead."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from memlib import estimate, load_model
from memlib.paper import paper_training
from memlib.report import ch10_validation as ch

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "10_validation.md"
MODELS = ("deepseek-v3", "deepseek-v2", "deepseek-v2-lite")

#: DeepSeek-V3's results in its chapter (one layer, its parameters, its miniature's measurements),
#: none of which may appear in another model's
V3_NUMBERS = ("671,026,404,352", "12.19 GiB", "14.80 GiB", "15,157.33", "6.13 GiB", "1.75 GiB", "44.38 GiB",
              "53.60 GiB", "496.06", "116.39", "640.06", "240.06", "1,408.88", "448,532", "601,248", "901,872")


@pytest.fixture(scope="module", autouse=True)
def extra():
    if os.environ.get("CI", "").lower() in ("1", "true"):
        return
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from memlib.measure.megatron import available

    if not available():
        pytest.skip("megatron-core not installed")


def est(model: str):
    m = load_model(model)
    e = estimate(m, paper_training(m))
    ch.measure(e)
    return e


def chapter_text(e) -> str:
    """Everything the chapter computes for its model (the GPU run, a fixed record, is left out)."""
    parts = [ch.notation(e), ch.miniature_table(e), ch.parameter_table(e), ch.hf_table(e), ch.group_table(e),
             ch.entry_table(e), ch.megatron_table(e), ch.side_table(e), ch.megatron_entry_table(e)]
    parts += list(ch.values(e).values()) + list(ch.problem_values(e).values())
    return "\n".join(parts)


@pytest.fixture(scope="module")
def texts():
    return {m: chapter_text(est(m)) for m in MODELS}


def test_deepseek_v3_chapter_has_its_numbers(texts):
    missing = [n for n in V3_NUMBERS if n not in texts["deepseek-v3"]]
    assert not missing


@pytest.mark.parametrize("model", ["deepseek-v2", "deepseek-v2-lite"])
def test_another_models_chapter_has_no_deepseek_v3_number(texts, model):
    assert not [n for n in V3_NUMBERS if n in texts[model]]


@pytest.mark.parametrize("model", MODELS)
def test_every_claim_holds_for_each_model(model):
    e = est(model)
    v = ch.values(e)
    assert v["model"] in ("DeepSeek-V3", "DeepSeek-V2", "DeepSeek-V2-Lite")
    assert (v["hf_verdict"], v["m_verdict"], v["params_verdict"], v["m_states_verdict"]) == (
        "match exactly", "agree byte for byte", "agree exactly", "equal")
    assert v["hf_exact"] == v["hf_configs"] and v["m_exact"] == v["m_configs"] and v["hf_mismatched"] == "0"
    assert v["random_exact"] == v["random_configs"] and v["others_verdict"] == "agree exactly as well"
    assert v["layer_more"] == "more" and v["top_group"] == "attention scores"
    p = ch.problem_values(e)
    assert p["hf_growth"] == p["paper_growth"] == "more than doubles"
    assert p["others_bound"] == "no other group more than doubles"
    # the miniature's fields are the model's own: no query-compression row where the model has none
    assert ("| `q_lora_rank` ($d_{c'}$) |" in ch.miniature_table(e)) == (model != "deepseek-v2-lite")
    assert ch.parameter_table(e).splitlines()[-1].endswith("| +0 |")


@pytest.mark.parametrize("model", MODELS)
def test_the_gpu_run_is_the_same_record_for_every_model(model):
    e = est(model)
    g = ch.gpu_values(e)
    assert (g["torch"], g["torch_pinned"], g["torch_same"]) == ("2.11.0", "2.13.0", "not the pinned version")
    assert (g["torch_build"], g["cuda"], g["transformers"], g["transformers_same"]) == (
        "2.11.0+cu130", "built for CUDA 13.0", "5.24.0", "the pinned version")
    assert g["order"] == "small, medium, v3-widths"
    assert g["shared"] == "$d_{h}$ = 128, $d_{v}$ = 128, $d^{R}_{h}$ = 64, $n_{g}$ = 1, $k_{g}$ = 1, $n_{MTP}$ = 0"
    assert (g["verdict"], g["big"], g["big_widths"]) == ("equals", "v3-widths", "DeepSeek-V3's widths")
    assert g["big_is_model"] == ("this book's model" if model == "deepseek-v3" else "not this book's model")
    assert (g["big_reserved"], g["big_held"], g["big_weights"], g["big_peak"], g["big_over_peak"]) == (
        "78.38 GiB", "31.79 GiB", "25.98 GiB", "61.09 GiB", "17.29 GiB")
    allocator = ch.gpu_allocator_table()
    assert "| v3-widths | 25.98 | 31.79 | ≥ 57.77 | 35.12 | ≥ 61.09 | 78.38 | ≤ 17.29 |" in allocator
    assert "GB" not in allocator.replace("GiB", "")
    assert "| v3-widths | 7,168 | 128 | 1,536 | 512 | 18,432 | 2,048 | 256 | 8 | 1 | 129,280 | 1 dense, 1 MoE | 1 | 4,096 | " \
           "DeepSeek-V3 |" in ch.gpu_config_table()
    assert "−31,244" in ch.gpu_bytes_table()


def test_the_figures_draw():
    import matplotlib

    matplotlib.use("Agg")
    e = est("deepseek-v2-lite")
    fig = ch.hf_figure(e)
    assert len(fig.axes[0].collections) == 6                      # three hf-eager and three Megatron-Core cases
    fig = ch.side_figure(e)
    assert [t.get_text().split("\n")[0] for t in fig.axes[0].get_xticklabels()] == [
        "the paper's ledger", "Hugging Face eager", "Megatron-Core local", "Megatron-Core + TE"]


def test_every_glue_key_of_the_prose_is_glued():
    """Sphinx needs every key a role or directive names; the chapter's cells glue the values of
    ``values`` (``val_``), ``gpu_values`` (``val_gpu_``), ``step_values`` (``val_step_``), ``problem_values``
    (``val_p_``) and the
    tables and figures named in its glue_md and glue_figure calls."""
    text = NOTEBOOK.read_text(encoding="utf-8")
    used = set(re.findall(r"\{glue:(?:text|md)\}`([A-Za-z0-9_]+)(?::myst)?`", text))
    used |= set(re.findall(r"```\{glue:(?:md|figure)\} ([A-Za-z0-9_]+)", text))
    e = est("deepseek-v2")
    glued = {f"val_{k}" for k in ch.values(e)} | {f"val_gpu_{k}" for k in ch.gpu_values(e)}
    glued |= {f"val_p_{k}" for k in ch.problem_values(e)} | {f"val_step_{k}" for k in ch.step_values()}
    glued |= set(re.findall(r"glue_(?:md|figure)\(\"([A-Za-z0-9_]+)\"", text)) | {f"val_c_{k}" for k in ch.clauses(e)}
    assert used - glued == set()
    assert "glue_values(\"val\", ch.values(EST))" in text
    assert "GPU = ch.gpu_values(EST)" in text and "glue_values(\"val_gpu\", GPU)" in text
    assert "glue_values(\"val_p\", ch.problem_values(EST))" in text
