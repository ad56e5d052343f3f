"""Which tests are slow: ``pytest -m "not slow"`` (``make test-fast``) is the inner loop, ``pytest`` (CI) runs all.

The ``slow`` marker is registered in pyproject.toml; this file puts it on the tests that took several seconds
or more each in ``pytest --durations=120`` on the project's 2-core machine: the measurements with torch and
Megatron-Core (whole modules, and every test that uses one of their measuring fixtures), the book's builds,
browsers and notebook executions, the fuzzing, and the Hypothesis properties with many examples.  One list
here rather than a decorator in each module, so that the inner loop is seen at a glance;
``tests/test_conftest.py`` checks that every name in it still exists.

The tests sit in folders that mirror memlib's packages (tests/device/ tests memlib/device/, tests/book/ the book's
builds); the lists name a module by its file name alone, which is unique across the folders (pytest's default
import mode needs that too).  A few test modules lend helpers to others in another folder (tests/report/
test_diagrams.py draws tests/model/test_architectures.py's random configs, tests/device/test_megatron_buffers.py
uses tests/measure/test_measure_megatron.py's megatron-core fixture), so every test folder is put on ``sys.path``
here, after what is there, as pytest puts a collected module's folder: running one file alone imports the same.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

#: the folders holding test modules, tests/ itself first (pyproject.toml's pythonpath puts it on sys.path)
TEST_FOLDERS = sorted({p.parent for p in Path(__file__).resolve().parent.rglob("test_*.py")})
sys.path.extend(str(f) for f in TEST_FOLDERS if str(f) not in sys.path)

#: modules every test of which is slow (torch or megatron-core measurements, builds, fuzzing, Hypothesis)
SLOW_MODULES = frozenset({
    "test_measure.py", "test_measure_megatron.py", "test_measure_peak.py", "test_measure_families.py",
    "test_architectures.py", "test_rerun.py", "test_book_reproducible.py", "test_book_html.py", "test_book_pdf.py",
    "test_fuzz.py", "test_properties.py",
})

#: single slow tests, ``module::function``
SLOW_TESTS = frozenset({
    "test_notebooks.py::test_notebook_executes",
    # every preset's book rendered (tests/book_prose.py), about 20 s a model
    "test_book_every_model.py::test_every_chapter_computes",
    "test_book_every_model.py::test_no_word_of_a_block_the_model_lacks",
    "test_book_every_model.py::test_no_sentence_no_person_would_write",
    "test_book_every_model.py::test_every_fit_verdict_agrees_with_its_peak",
    "test_book_every_model.py::test_a_causal_sentence_only_where_its_verdict_holds",
    "test_plan.py::test_the_deepseek_v3_recipe_is_found_and_ranked",
    "test_plan.py::test_the_process_ends_after_its_whole_output",
    "test_plan.py::test_a_progress_bar_on_a_terminal_only",
    "test_plan.py::test_a_small_full_search_is_exact_and_complete",
    "test_peak.py::test_more_routing_imbalance_never_lowers_the_peak",
    "test_peak.py::test_the_peak_is_never_below_the_held_activations",
    "test_peak.py::test_offloading_never_raises_and_the_overlap_never_lowers_the_peak",
    "test_peak.py::test_megatron_fp8_never_raises_the_activations",
    "test_peak_cpu.py::test_gqa_core_attention_backward_matches_the_measured_step",
    "test_compiled.py::test_fast_int64_path_only_where_its_bound_holds",
    "test_compiled.py::test_vectorised_equals_estimate_to_the_byte",
    "test_megatron_buffers.py::test_layout_properties",
    "test_cli.py::test_estimate_activation_error_through_python_m",
    "test_formulas.py::test_cli_formula",
    "test_report_ch10.py::test_every_claim_holds_for_each_model",
    "test_report_ch10.py::test_the_gpu_run_is_the_same_record_for_every_model",
    "test_plan_exact.py::test_every_listed_peak_equals_estimate_over_option_lists",
    "test_input_rules.py::test_a_precision_spec_with_commas_is_one_item",
})

#: fixtures that measure (a Megatron-Core step, a gloo world, the chapter-10 measurements) or draw every figure:
#: a test that uses one is slow
SLOW_FIXTURES = frozenset({"measured", "measured_pairs", "steps", "world1", "world4", "mcore", "texts", "figures"})


def is_slow(item: pytest.Item) -> bool:
    module = Path(item.nodeid.split("::")[0]).name
    function = getattr(item, "originalname", None) or item.name
    return (module in SLOW_MODULES or f"{module}::{function}" in SLOW_TESTS
            or bool(SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_slow(item):
            item.add_marker(pytest.mark.slow)
