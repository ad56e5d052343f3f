"""The errata items and the ledger table the book shows (issue #8's book findings, each pinned)."""
from __future__ import annotations

from memlib import estimate
from memlib.paper import paper_training
from memlib.paper.errata import KINDS, counts, errata
from memlib.report import ch06_activations as act
from memlib.report.tables import errata_summary, render


def est():
    return estimate("deepseek-v3", paper_training("deepseek-v3"))


def items():
    return {e.id: e for e in errata(est())}


def computed(e):
    return render(e.computed, e.values)


def reason(e):
    return render(e.reason, e.values)


def test_counts_add_up_and_the_sentence_names_every_kind():
    c = counts(list(items().values()))
    assert set(c) <= set(KINDS) and sum(c.values()) == len(items())
    sentence = errata_summary(c)
    tallied = sum(int(part.split()[0]) for part in sentence.replace(" and ", ", ").split(", "))
    assert tallied == len(items())


def test_deepseeks_statements_are_explained_by_what_rounds_to_what():
    e = items()["ds-activated"]
    assert "36.6B, not 36.7B" in reason(e) and "truncates" in reason(e)
    e = items()["ds-mtp"]
    assert "decoder block alone (11.5B)" in reason(e) and "is 11.6B" in reason(e)
    assert "ds-checkpoint" not in items()      # 685B is right once the FP8 scales are counted (chapter 3)


def test_the_two_activation_conventions_are_listed():
    e = items()
    assert "235,143,168" in e["s5-full-checkpoints"].printed
    assert computed(e["s5-full-checkpoints"]).startswith("117,440,512 bytes")     # 4 layers x 2bsh / TP
    assert "16,777,216" in e["s5-latent-norms"].printed                            # 2 b s (d_c' + d_c)
    assert computed(e["s5-latent-norms"]).startswith("33,554,432 bytes")           # twice


def test_the_moe_ledger_table_prints_bytes_per_element():
    """The routed experts' rows once printed "2*EP (bf16)" and "EP (mask)"."""
    rows = [r for r in act.ledger_table(est(), "moe").splitlines() if "routed" in r]
    assert rows and all("EP (" not in r.split("|")[3] for r in rows)
    cells = {r.split("|")[3].strip() for r in rows}
    assert cells == {"2 (bf16)", "1 (mask)"}
    assert all("$EP$" in r.split("|")[4] and r"$\uparrow$" in r.split("|")[4] for r in rows)   # tokens rounded up
