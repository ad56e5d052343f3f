"""The summary page's module: every numbered equation once, in the book's order; DeepSeek-V3's knobs."""
from __future__ import annotations

import re

from memlib.formulas import book_formulas
from memlib.report import summary as ch
from memlib.scenarios import deepseek as ds


def test_formula_table_lists_every_numbered_equation_in_order():
    table = ch.formula_table()
    numbers = re.findall(r"^\| \(([\d.]+)\) \|", table, re.M)
    assert sorted(numbers) == sorted(f.number for f in book_formulas() if f.number)
    assert numbers == sorted(numbers, key=lambda n: tuple(int(x) for x in n.split(".")))
    assert "| (3.6) | `params.total` | parameters of the main model (no MTP, no buffers) |" in table


def test_knob_table_for_deepseek_v3():
    rows = ds.ablation("deepseek-v3", ds.deepseek_recipe("deepseek-v3"))
    table = ch.knob_table(rows)
    assert "| naive baseline |" in table and "| 140.33 GiB | — | no |" in table
    assert table.strip().endswith("| 70.62 GiB | −41.54 GiB | yes |")
    assert "fits the H800" in table


def test_knob_values_name_the_model_or_say_the_recipe_does_not_apply():
    import tiny as T
    v = ch.knob_values("deepseek-v2-lite")
    assert v["model"] == "DeepSeek-V2-Lite" and "| naive baseline |" in v["table"]
    one = ch.knob_values(T.tiny(num_hidden_layers=1, first_k_dense_replace=0))
    assert one["table"].startswith("DeepSeek-V3's recipe does not apply to tiny: num_hidden_layers=1")
