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
    # a test's goldens of one platform written at two commits can show alike (gpt3_mcore_tp1_pp2 on lts and
    # lts_dgx_a100): each row is one of the cases it names
    by: dict = {}
    for c in ok:
        by.setdefault((c.golden.test + (" (2nd run)" if c.golden.second_run else ""),
                       f"{c.golden.environment} {c.golden.platform}, {c.world_size:,} GPUs",
                       fmt_bytes(c.steady, "GiB", 2, with_unit=False)), []).append(c)
    for row in rows:
        # the names may wrap after an underscore (a zero-width space), nothing else is added to them
        named = by[(row[0].replace("\u200b", ""), row[1].replace("\u200b", ""), row[2])]
        c = next(c for c in named if row[3] == fmt_bytes(c.predicted, "GiB", 2, with_unit=False))
        named.remove(c)
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
    short = _rows(ch.reasons_table())
    assert [r[:2] for r in short] == [r[:2] for r in reasons]
    assert [int(r[2]) for r in short] == [len(r[2].split(", ")) for r in reasons]
    fig = ch.measured_figure()
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


def test_misses_table_collapses_every_missed_case_into_its_test():
    """One row per functional test with a miss; its files add up to the misses, and its error range holds every
    missed file's error (checked against the per-case rows, which the HTML book prints)."""
    ok, _ = fv.validation()
    missed = [c for c in ok if not c.within_target]
    rows = _rows(ch.misses_table())
    assert len(rows) == len({c.golden.test for c in missed}) == len(rows) == len({r[0] for r in rows})
    assert sum(int(r[2].replace(",", "")) for r in rows) == len(missed) == int(ch.values()["n_missed"].replace(",", ""))
    by_test = {r[0].replace("\u200b", ""): r for r in rows}
    for test, row in by_test.items():
        errors = sorted(c.error for c in missed if c.golden.test == test)
        ends = row[3].split(" to ")
        assert ends[0] == ch._err(errors[0]) and ends[-1] == ch._err(errors[-1])
        assert all(ch._where(c.miss_location) in row[4] for c in missed if c.golden.test == test)


def test_where_a_miss_lies():
    ok, _ = fv.validation()
    c = next(c for c in ok if not c.within_target)
    place, short = c.miss_location
    gap = c.post_step_gap if place == "after the step" else c.peak_gap
    assert abs(gap) == max(abs(c.post_step_gap), abs(c.peak_gap)) and short == (gap > 0)


def test_the_worked_problem_is_a_deepseek_style_miss_and_its_parts_add_up():
    c = fv.worked_case()
    missed = [m for m in fv.cases() if not m.within_target]
    ds = [m for m in missed if m.family == fv.FAMILIES[0]]
    assert c in (ds or missed) and abs(c.error) == max(abs(m.error) for m in (ds or missed))
    w = ch.worked_values()
    assert w["test"] == c.golden.test and w["place"] == c.miss_location[0]
    assert c.post_step_gap + c.peak_gap == c.steady - c.predicted
    counts = fv.chapter_counts()
    assert sum(counts.miss_places.values()) == counts.all.missed


def test_every_table_has_as_many_cells_as_headers():
    """A '|' in a header or a cell ('mean |error|') splits it: Markdown then prints the table as text."""
    for table in (ch.family_table(), ch.misses_table(), ch.reasons_table(), ch.not_expressible_table(),
                  ch.cases_table(), ch.published_table(), ch.published_stage_table(), ch.assumptions_table(),
                  ch.not_used_table()):
        widths = {line.count("|") for line in table.splitlines()}
        assert len(widths) == 1, table.splitlines()[0]


def test_the_takeaway_names_where_most_misses_lie():
    counts = fv.chapter_counts().miss_places
    v = ch.values()
    assert counts[v["miss_most"]] == max(counts.values()) and v["n_miss_most"] == f"{counts[v['miss_most']]:,}"
