"""The measured-peaks chapter's module: one row per case, the values the prose glues, the figure."""
from __future__ import annotations

from memlib.report import ch11_measured as ch
from memlib.scenarios import measured as sm
from memlib.core.units import fmt_bytes


def _rows(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def test_cases_table_has_one_row_per_case_with_its_numbers():
    cases = sm.measured_cases()
    rows = _rows(ch.cases_table())
    assert len(rows) == len(cases)
    for row, c in zip(rows, cases):
        assert row[0].startswith(c.case.label)
        assert row[3] == fmt_bytes(c.steady, "GiB", 2, with_unit=False)
        assert row[4] == fmt_bytes(c.predicted, "GiB", 2, with_unit=False)
        assert row[6] == ("yes" if c.within_target else "no")
        assert ("†" in row[0]) == (not c.case.issue)


def test_values_are_the_librarys():
    v = ch.values()
    cases = sm.measured_cases()
    assert v["n_cases"] == str(len(cases)) and v["n_within"] == str(sm.summary(cases)["within"])
    assert v["proxy_world"] == "64" and v["gb200_world"] == "32" and v["proxy_dp"] == "8"
    assert v["n_not_expressible"] == str(len(sm.NOT_EXPRESSIBLE))
    assert all(isinstance(x, str) and x for x in v.values())


def test_gaps_list_every_case_over_the_target():
    rows = _rows(ch.gaps_table())
    over = [c for c in sm.measured_cases() if not c.within_target]
    assert [r[0] for r in rows] == [c.case.label for c in over]
    for c in over:                        # the two parts of the error add up to it
        assert c.post_step_unexplained + c.dynamic_gap == c.steady - c.predicted


def test_other_tables_and_the_figure():
    assert len(_rows(ch.not_expressible_table())) == len(sm.NOT_EXPRESSIBLE)
    assert len(_rows(ch.post_step_table())) == len(_rows(ch.run_max_table())) == len(sm.CASES)
    assert _rows(ch.framework_table())[-1][0] == "total"
    fig = ch.figure()
    ax = fig.axes[0]
    assert len(ax.get_xticks()) == len(sm.CASES) and ax.get_legend() is not None


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
