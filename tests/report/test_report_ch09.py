"""Chapter 9's module: every table, value and figure for DeepSeek-V3 and for other models, no
DeepSeek-V3 result in another model's chapter, and glued words that agree with the numbers."""
from __future__ import annotations

import re

import pytest

from memlib import estimate
from memlib.report import ch09_deepseek as ch
from memlib.report.figures import CATEGORY_COLORS
from memlib.report.format import fmt_bytes, fmt_difference
from memlib.scenarios import deepseek as ds

MODELS = ("deepseek-v3", "deepseek-v2", "deepseek-v2-lite")


def chapter_est(model: str):
    return estimate(model, ds.deepseek_recipe(model))


def chapter_values(est) -> dict[str, str]:
    return {**ch.values(est), **ch.ablation_values(est), **ch.problem_values(est), **ch.choices_values(est)}


def chapter_text(est) -> str:
    parts = [ch.notation(est), ch.ablation_table(est), ch.rank_table(est), ch.ledger_table(est), ch.choices_table(est)]
    return "\n".join(parts + list(chapter_values(est).values()))


def v3_headline_numbers() -> set[str]:
    """DeepSeek-V3's results as its chapter prints them (read from the chapter, not typed)."""
    est = chapter_est("deepseek-v3")
    v = chapter_values(est)
    nums = {v[k] for k in ("peak", "peak_alloc", "peak_states", "peak_acts", "rank0", "layer_plain", "layer_recipe",
                           "layer_saved", "peak_high", "base", "base_largest_bytes", "final", "saved", "p_peak",
                           "p_acts", "base_params", "dual_params")}
    nums |= {v[k].split(" ", 1)[1] for k in v if k.endswith("_effect")}          # "costs 43.53 GiB" -> the bytes
    return nums


@pytest.fixture(scope="module")
def v3():
    return chapter_est("deepseek-v3")


def test_deepseek_v3_chapter_has_its_headline_numbers(v3):
    text = chapter_text(v3)
    nums = v3_headline_numbers()
    assert {"70.62 GiB", "140.33 GiB", "63.09 GiB", "631.03 MiB"} <= nums
    assert all(n in text for n in nums)
    v = chapter_values(v3)
    assert v["peak_ranks"] == "ranks 1–14" and v["label"] == "PP16@TP1@EP64@ETP1" and v["gpus"] == "2,048"
    assert (v["shallow_mb"], v["deep_mb"], v["peak_mb"]) == ("15", "2", "17")


@pytest.mark.parametrize("model", ["deepseek-v2", "deepseek-v2-lite"])
def test_another_models_chapter_has_no_deepseek_v3_number(model):
    text = chapter_text(chapter_est(model))
    leaked = sorted(n for n in v3_headline_numbers() if n in text)
    assert not leaked, leaked
    assert chapter_values(chapter_est(model))["model"] != "DeepSeek-V3"


def _table_rows(md: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines()[2:]]


@pytest.mark.parametrize("model", MODELS)
def test_the_glued_words_agree_with_the_numbers(model):
    est = chapter_est(model)
    cap_est = ds.recipe_estimate(model, est.train)
    v = chapter_values(est)
    pk = cap_est.peak
    assert v["peak"] == fmt_bytes(pk.total)
    assert v["peak_fits"] == ("fits" if pk.total <= ds.CAPACITY else "does not fit")
    assert v["peak_margin"].startswith("leaves" if pk.total <= ds.CAPACITY else "exceeds")
    assert v["all_fit"] == ("every rank fits" if all(s.total <= ds.CAPACITY for s in cap_est.stages)
                            else "not every rank fits")
    # the ablation: each step's word and the table's fits column against the step's own estimate
    steps = ds.ablation_steps(est.train)
    totals = [ds.recipe_estimate(model, s.train).peak.total for s in steps]
    table = _table_rows(ch.ablation_table(est))
    assert [row[-1] for row in table] == ["yes" if t <= ds.CAPACITY else "no" for t in totals]
    for step, before, after in zip(steps[1:], totals, totals[1:]):
        word = v[f"{step.key}_effect"]
        assert word.startswith("costs" if after > before else "saves" if after < before else "changes nothing"), step.key
        assert word.endswith(fmt_difference(after, before) if after > before else fmt_difference(before, after))
    assert v["base_fits"] == ("fits" if totals[0] <= ds.CAPACITY else "does not fit")
    assert v["final_fits"] == ("fits" if totals[-1] <= ds.CAPACITY else "does not fit")
    if all(t > ds.CAPACITY for t in totals[:-1]) and totals[-1] <= ds.CAPACITY:
        assert v["fit_summary"].startswith("only the last step")
    if all(t <= ds.CAPACITY for t in totals):
        assert v["fit_summary"].startswith("every step fits")
    # the rank table's fits column, the overhead bands and the worked problem
    ranks = _table_rows(ch.rank_table(est))
    per_rank = []                                   # a row of ranks "1–14" holds their common verdict
    for row in ranks:
        first, _, last = row[0].partition("–")
        per_rank += [row[-1]] * (int(last or first) - int(first) + 1)
    assert per_rank == ["yes" if s.total <= ds.CAPACITY else "no" for s in cap_est.stages]
    high = ds.recipe_estimate(model, est.train, "high").peak.total
    assert v["high_fits"] == ("fits" if high <= ds.CAPACITY else "does not fit")
    two = ds.recipe_estimate(model, est.train.with_(micro_batch=ch.PROBLEM_MICRO_BATCH)).peak.total
    assert v["p_verdict"] == ("fits" if two <= ds.CAPACITY else "does not fit")
    assert v["p_peak"] == fmt_bytes(two)


def test_deepseek_v3_words():
    v = chapter_values(chapter_est("deepseek-v3"))
    assert v["final_fits"] == "fits" and v["base_fits"] == "does not fit" and v["high_fits"] == "does not fit"
    assert v["dualpipe_effect"].startswith("costs") and v["recompute_effect"].startswith("saves")
    assert v["fit_summary"] == "only the last step, the full recipe, fits the device"
    assert v["rank0_compare"].endswith("less than the peak") and "MTP" in v["rank0_holds"]
    assert v["p_verdict"] == "does not fit" and v["p_margin"].startswith("exceeds the capacity by")
    # the fourteen middle ranks hold the same bytes: one row, ranks 0 and 15 (the embedding, head and MTP) apart
    rows = _table_rows(ch.rank_table(chapter_est("deepseek-v3")))
    assert [r[0] for r in rows] == ["0", "1–14", "15"]
    assert rows[1][1] == "1 (4) + 14 (4) … 7 (4) + 8 (4)" and rows[1][7].strip("*") == "70.62"


def test_no_table_mixes_gib_and_gb(v3):
    for md in (ch.ablation_table(v3), ch.rank_table(v3), ch.ledger_table(v3)):
        assert not re.search(r"\bGB\b", md) or not re.search(r"GiB", md)


@pytest.mark.parametrize("model", MODELS)
def test_the_figures_draw_and_the_capacity_line_crosses_no_label_and_its_label_no_bar(model):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    est = chapter_est(model)
    for fig, bars in ((ch.ablation_figure(est), 6), (ch.rank_figure(est), est.train.pp)):
        ax = fig.axes[0]
        assert len(ax.patches) == 3 * bars                         # model states, activations, overheads
        colors = {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches}
        assert colors == {c.lower() for c in (CATEGORY_COLORS["model_states"], CATEGORY_COLORS["activations"],
                                              CATEGORY_COLORS["overhead"])}
        fig.draw_without_rendering()
        line = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        assert len(line) == 1
        y = ax.transData.transform((0, line[0].get_ydata()[0]))[1]
        for t in ax.texts:
            box = t.get_window_extent()
            assert not box.y0 < y < box.y1, (model, t.get_text())
        # the line's label is in the legend, which covers no bar (Fig. 9.3's label ran over the tallest bar)
        legend = ax.get_legend()
        assert ch.CAPACITY_LABEL in [t.get_text() for t in legend.get_texts()]
        assert not any(legend.get_window_extent().overlaps(p.get_window_extent()) for p in ax.patches), model
        plt.close(fig)


@pytest.mark.parametrize("model", MODELS)
def test_memory_over_time_holds_pp_plus_one(model):
    """The DualPipe iteration's busiest step holds PP + 1 micro-batches, PP - h shallow and h + 1 deep,
    and its bytes are the estimate's allocated bytes of the peak rank."""
    from memlib.device.timeline import over_time

    est = chapter_est(model)
    ot = over_time(est)
    v = ch.memory_time_values(ot)
    p, r = est.train.pp, ot.peak_rank
    h = min(r, p - 1 - r)
    assert (v["shallow"], v["deep"], v["total"]) == (str(p - h), str(h + 1), str(p + 1))
    assert v["peak"] == fmt_bytes(max(s.allocated for s in est.stages))
    assert "overlapped with" in v["ops"]
    fig = ch.memory_time_figure(ot)
    assert len(fig.axes[0].lines) == p


def test_switch_values_in_words():
    from memlib.report.tables import attention_switch_values
    v = attention_switch_values({"paper_profile": "paper", "recipe_profile": "megatron", "paper_core": 5 * 2**30,
                                 "recipe_core": 2 * 2**20, "paper_deepseek_total": 10 * 2**30,
                                 "paper_deepseek_fits": False, "recipe_total": 2**30, "recipe_fits": True})
    assert (v["paper_core"], v["recipe_core"], v["paper_deepseek_fits"], v["recipe_fits"]) == (
        "5.00 GiB", "2.00 MiB", "does not fit", "fits")
    none = attention_switch_values({"paper_profile": "paper", "recipe_profile": None, "paper_core": 1,
                                    "recipe_core": None, "paper_deepseek_total": 1, "paper_deepseek_fits": True,
                                    "recipe_total": None, "recipe_fits": None})
    assert (none["recipe_total"], none["recipe_fits"]) == ("—", "—")


def test_the_recipes_open_choices_are_stated(v3):
    """numbers-check item 4: the recipe was described as recomputing "every RMSNorm output" and the SwiGLU
    output, while its ledger keeps the dense layers' pre-FFN norm output and the shared experts' SwiGLU output;
    the table now comes from the ledger, and DualPipe's mirrored optimizer states are priced."""
    rows = {r[0]: r[1:] for r in _table_rows(ch.choices_table(v3))}
    kept = {name for name, (where, what) in rows.items() if what == "kept from the forward"}
    assert any("shared experts' SwiGLU" in k for k in kept) and any("input of fc1" in k for k in kept)
    assert rows["routed experts' SwiGLU output, input of fc2"] == ["MoE layers", "recomputed in backward"]
    c = ds.recipe_choices(v3.model, v3.train)
    opt = ds.recipe_estimate(v3.model, v3.train).stages[c["peak_rank"]].bytes["optimizer_states"]
    # twice the ranks: the shards halve, up to the rounding of each shard
    assert abs(2 * c["mirror_saving"] - opt) <= 2 * 4 * 64
    one_f_one_b = v3.train.with_(schedule="1f1b")
    assert ds.recipe_choices(v3.model, one_f_one_b)["mirror_saving"] == 0
    assert "E5M6" in ch.choices_values(v3)["e5m6_clause"]



@pytest.mark.parametrize("model", ["mixtral-8x7b", "deepseek-v3", "llama-3-8b"])
def test_the_switch_sentence_does_not_contradict_the_choices_table(model):
    """The eager-attention sentence said the deepseek policy "recomputes only the norms" a few lines above a table
    in which the routed experts' SwiGLU output is recomputed too (issue 24); what it means is that the policy
    recomputes none of the attention core's tensors, and it says so, whatever else the recipe recomputes."""
    from memlib import load_model

    m = load_model(model)
    sentence = ch.switch_values(ds.attention_switch(m), m)["paper_deepseek_sentence"]
    recomputed = [r[0] for r in _table_rows(ch.choices_table(chapter_est(model))) if r[2] == "recomputed in backward"]
    assert recomputed and "recomputes none of them" in sentence
    assert not re.search(r"recomputes only", sentence), sentence


@pytest.mark.parametrize("model", ["deepseek-v3", "llama-3-8b", "mixtral-8x7b"])
def test_the_recompute_step_claims_no_norm_output_the_recipe_keeps(model):
    """The ablation's last step said "every RMSNorm output recomputed" where the recipe keeps the dense FFN's norm
    output (fused into fc1): the step names what the choices table recomputes, no more."""
    est = chapter_est(model)
    kept = [r[0] for r in _table_rows(ch.choices_table(est)) if r[2] == "kept from the forward"]
    what = next(r["what"] for r in ds.ablation(est.model, est.train) if r["key"] == "recompute")
    if any("norm" in k.lower() for k in kept):
        assert "every" not in what, (what, kept)
