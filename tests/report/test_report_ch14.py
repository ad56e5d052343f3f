"""The errata chapter's module: every item for the paper's model, none for another."""
from __future__ import annotations

import re

import pytest

from memlib import estimate
from memlib.paper import paper_training
from memlib.paper.errata import KINDS, errata
from memlib.report import ch14_errata as ch


def est(model):
    return estimate(model, paper_training(model))


def test_every_item_is_in_one_chapter_table_and_counted():
    e = est("deepseek-v3")
    items = errata(e)
    rows = sum(ch.table(e, c).count("\n") - 1 for c in ch.CHAPTERS)
    assert rows == len(items) == int(ch.values(e)["n_all"])
    assert {i.chapter for i in items} <= set(ch.CHAPTERS) and {i.kind for i in items} <= set(KINDS)
    tables = re.sub(r"\$[^$]*\$", "", "".join(ch.table(e, c) for c in ch.CHAPTERS))   # math has braces
    assert "{" not in tables                                                  # every template field filled


@pytest.mark.parametrize("model", ["deepseek-v2", "deepseek-v2-lite"])
def test_no_item_for_another_model(model):
    e = est(model)
    assert errata(e) == [] and ch.values(e) == {}
    assert all(ch.table(e, c).count("\n") == 1 for c in ch.CHAPTERS)


def test_paper_keys_are_the_values_keys():
    assert set(ch.values(est("deepseek-v3"))) == set(ch.PAPER_KEYS)
