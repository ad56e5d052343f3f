"""The measured-peaks chapter's module: one row per case, the values the prose glues, the figure."""
from __future__ import annotations

from memlib.report import ch11_measured as ch
from memlib.scenarios import functional as fv, measured as sm
from memlib.core.units import fmt_bytes


def _rows(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_cases_table_has_one_row_per_case_with_its_numbers():
    ok, _ = fv.validation()
    rows = _rows(ch.cases_table())
    assert len(rows) == len(ok)
    by = {(c.golden.test + (" (2nd run)" if c.golden.second_run else ""),
           f"{c.golden.environment} {c.golden.platform}, {c.world_size:,} GPUs",
           fmt_bytes(c.steady, "GiB", 2, with_unit=False)): c for c in ok}
    for row in rows:
        # the names may wrap after an underscore (a zero-width space), nothing else is added to them
        c = by[(row[0].replace("\u200b", ""), row[1].replace("\u200b", ""), row[2])]
        assert row[3] == fmt_bytes(c.predicted, "GiB", 2, with_unit=False)
        assert (row[6] == "yes") == c.within_target
        # the two parts of the error add up to it
        assert c.post_step_gap + c.peak_gap == c.steady - c.predicted


def test_values_are_the_librarys():
    v = ch.values()
    ok, no = fv.validation()
    s = fv.summary(ok)
    assert v["n_cases"] == f"{len(ok):,}" and v["n_within"] == f"{s['within']:,}"
    assert v["n_not_expressible"] == f"{len(no):,}" and v["n_files"] == f"{len(ok) + len(no):,}"
    assert all(isinstance(x, str) and x for x in v.values())


def test_family_and_not_expressible_tables_and_the_figure():
    ok, no = fv.validation()
    fam = _rows(ch.family_table())
    assert sum(int(r[2].replace(",", "")) for r in fam) == len(ok)
    assert sum(int(r[3].replace(",", "")) for r in fam) == fv.summary(ok)["within"]
    reasons = _rows(ch.not_expressible_table())
    assert sum(int(r[1].replace(",", "")) for r in reasons) == len(no)
    fig = ch.figure()
    ax = fig.axes[0]
    assert (ax.get_legend() or fig.legends) and sum(len(c.get_offsets()) for c in ax.collections) == len(ok)


def test_published_tables_are_the_librarys():
    cases = sm.published_cases()
    rows = _rows(ch.published_table())
    assert [r[0] for r in rows] == [c.label for c in cases]
    for row, c in zip(rows, cases):
        assert row[4] == fmt_bytes(c.measured_max, "GiB", 2, with_unit=False)
        assert row[5] == fmt_bytes(c.predicted, "GiB", 2, with_unit=False)
        assert row[7] == ("yes" if c.within_target else "no")
    staged = _rows(ch.published_stage_table())
    assert len(staged) == sum(len(c.peaks) for c in cases if len(c.peaks) > 1)
    assert len(_rows(ch.assumptions_table())) == len(sm.SIMUMAX_ASSUMPTIONS)
    not_used = _rows(ch.not_used_table())
    assert len(not_used) == len(sm.PUBLISHED_NOT_USED) and all(r[3] for r in not_used)
    v = ch.published_values()
    assert v["n_runs"] == str(len(cases)) and v["n_within"] == str(sum(c.within_target for c in cases))
    assert all(isinstance(x, str) and x for x in v.values())
