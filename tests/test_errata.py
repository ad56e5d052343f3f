"""The errata items and the ledger table the book shows (issue #8's book findings, each pinned)."""
from __future__ import annotations

from memlib.config import PAPER_TRAINING, load_model
from memlib.report import activations as act
from memlib.report import errata


def items():
    return {e.id: e for e in errata.errata(load_model("deepseek-v3"), PAPER_TRAINING)}


def test_counts_add_up_and_the_sentence_names_every_kind():
    c = errata.errata_counts()
    n = int(c["all"])
    assert sum(int(c[k]) for k in errata.KINDS) == n == len(items())
    tallied = sum(int(part.split()[0]) for part in c["summary"].replace(" and ", ", ").split(", "))
    assert tallied == n


def test_the_replicated_share_is_right_on_one_device():
    e = items()["dd-replicated-share"]
    assert e.kind == "reading" and e.printed == "26%"
    assert e.computed.startswith("25.8% of one TP2 device's MLA parameters (110,886,912 of 429,654,016)")


def test_deepseeks_statements_are_explained_by_what_rounds_to_what():
    e = items()["ds-activated"]
    assert "36.6B, not 36.7B" in e.reason and "truncates" in e.reason
    e = items()["ds-mtp"]
    assert "decoder block (11.5B)" in e.reason and "is 11.6B" in e.reason


def test_the_two_activation_conventions_are_listed():
    e = items()
    assert "235,143,168" in e["s5-full-checkpoints"].printed
    assert e["s5-full-checkpoints"].computed.startswith("117,440,512 bytes")       # 4 layers x 2bsh / TP
    assert "16,777,216" in e["s5-latent-norms"].printed                            # 2 b s (d_c' + d_c)
    assert e["s5-latent-norms"].computed.startswith("33,554,432 bytes")            # twice


def test_the_moe_ledger_table_prints_bytes_per_element():
    """The routed experts' rows once printed "2*EP (bf16)" and "EP (mask)"."""
    rows = [r for r in act.ledger_table(load_model("deepseek-v3"), "moe").splitlines() if "routed" in r]
    assert rows and all("EP (" not in r.split("|")[3] for r in rows)
    cells = {r.split("|")[3].strip() for r in rows}
    assert cells == {"2 (bf16)", "1 (mask)"}
    assert all("$EP$" in r.split("|")[4] and "rounded up" in r.split("|")[4] for r in rows)
