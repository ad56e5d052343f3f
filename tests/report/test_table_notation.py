"""No symbol written in ASCII (``W^QR``, ``c^KV``, ``E_token``, ``N_r``) reaches a rendered table: every table
of the book goes through memlib.report.format.md_table, which typesets them from the symbol registry.  Checked
on the texts that carry such symbols into the tables of chapters 4, 6, 9, 10 and 11 (the ledgers' tensor names
and notes, the errata's printed values and reasons) and on the typesetting itself."""
from __future__ import annotations

import re

import pytest

from memlib import PAPER_TRAINING, estimate
from memlib.model.profiles import act_profile
from memlib.paper.errata import errata
from memlib.report.format import ascii_symbols, md_table, typeset
from memlib.report.tables import errata_table

#: an ASCII symbol: a tensor with a superscript, the paper's E_token, or a registry symbol with a subscript
RAW = re.compile(r"(?<![\w$\\{^.])(?:[Wc]\^[A-Z]{1,3}|E_token|" +
                 "|".join(re.escape(k) for k in sorted(ascii_symbols(), key=len, reverse=True)) + r")(?![\w{^'])")


def raw_symbols(table: str) -> list[str]:
    """ASCII symbols in a Markdown table outside math and code."""
    found = []
    for line in table.splitlines():
        text = re.sub(r"`[^`]*`", "", re.sub(r"\$[^$]*\$", "", line))
        found += RAW.findall(text)
    return found


def test_the_check_finds_raw_symbols():
    assert raw_symbols("| key-value latent c^KV | 3 E_token h | d_c' + d_c |") == ["c^KV", "E_token", "d_c'", "d_c"]
    assert raw_symbols("| $c^{KV}$ | `N_r` | golden_values_dev.json |") == []


@pytest.mark.parametrize("text, out", [
    ("query latent c^Q, input of W^UQ and W^QR", "query latent $c^{Q}$, input of $W^{UQ}$ and $W^{QR}$"),
    ("(N/EP) E_token = b s N_r / EP", "(N/EP) $E_{token}$ = b s $N_r$ / EP"),
    ("d_h^R and d_h, n_kv heads", "$d_h^R$ and $d_h$, $n_{kv}$ heads"),
    ("v_head_dim, `d_h`, $d_h$, model_config.yaml", "v_head_dim, `d_h`, $d_h$, model_config.yaml"),
])
def test_typeset(text, out):
    assert typeset(text) == out


@pytest.mark.parametrize("profile", ["paper", "megatron"])
def test_ledger_tables_have_no_raw_symbol(profile):
    m = estimate("deepseek-v3", PAPER_TRAINING).model
    rows = [[e.name, e.note] for kind in ("dense", "moe") for e in act_profile(profile).layer(m, kind)]
    assert any("c^KV" in r[0] or "W^" in r[0] for r in rows)            # the names do carry ASCII symbols
    assert raw_symbols(md_table(["tensor", "note"], rows)) == []


def test_errata_tables_have_no_raw_symbol():
    items = errata(estimate("deepseek-v3", PAPER_TRAINING))
    assert any("E_token" in e.printed for e in items)
    assert raw_symbols(errata_table(items)) == []


def _prose_lines(text: str):
    """Lines of a MyST file outside code and math blocks, with inline code and math blanked."""
    stack: list[tuple[str, bool]] = []
    for line in text.split("\n"):
        m = re.match(r"^\s*(`{3,}|~{3,}|:{3,})(.*)$", line)
        if m:
            f, info = m.group(1), m.group(2).strip()
            if stack and info == "" and f[0] == stack[-1][0][0] and len(f) >= len(stack[-1][0]):
                stack.pop()
            else:
                d = re.match(r"\{([^}]+)\}", info)
                stack.append((f, (d.group(1) in ("code-cell", "code", "math", "glue:math", "raw")) if d else True))
            continue
        if not any(code for _, code in stack):
            yield re.sub(r"`[^`]*`|\$[^$]*\$", "", line)


def test_number_formats_are_spelled_in_capitals_in_prose():
    """BF16, FP8, FP32 in the prose of every chapter (code, options and glue keys keep their spelling)."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    found = [(p.name, line.strip()) for p in sorted((root / "notebooks").glob("*.md")) + sorted((root / "book").glob("*.md"))
             for line in _prose_lines(p.read_text(encoding="utf-8"))
             if re.search(r"(?<![\w\-./=])(bf16|fp8|fp32)(?![\w\-/]|\.\w)", line)]
    assert found == []
    assert list(_prose_lines("```{code-cell} ipython3\nx = 'bf16'\n```\nin bf16 `bf16`")) == ["in bf16 "]


def test_a_notation_table_has_no_row_for_a_field_the_model_leaves_null():
    """DeepSeek-V3 sets no shared_expert_intermediate_size (Qwen2-MoE's) and no max_position_embeddings-driven
    learned positions field; V2-Lite no q_lora_rank: none of them is a row printing '(null)'."""
    from memlib import load_model
    from memlib.report.tables import notation_table

    for name in ("deepseek-v3", "deepseek-v2-lite", "llama-3-8b", "mixtral-8x7b"):
        table = notation_table(("model",), load_model(name))
        assert "(null)" not in table, name
    assert "q_lora_rank" in notation_table(("model",), load_model("deepseek-v3"))
    assert "q_lora_rank" not in notation_table(("model",), load_model("deepseek-v2-lite"))
