"""The book is true for every model it can be built for, tested without building twelve books.

For every preset the chapters' (and the summary page's) code cells run in-process and their Markdown is resolved as the
build resolves it (tests/book_prose.py, about 20 s a model); then:

* every chapter's glued values are computed without an error (a dense model has no MoE layer, a
  model without MTP no MTP module: nothing may divide by their count);
* the text of a chapter about the book's model uses no word of a block that model lacks (the
  table :data:`memlib.model.blocks.VOCABULARY`): no "MLA" in Mixtral's book, no MTP module in
  DeepSeek-V2's;
* no sentence is one no person would write ("1 MTP module(s)", "states 0 figures", "differ in
  three places" by 0, "stage none");
* every verdict agrees with its numbers: a peak called fitting is at most the card, a causal
  "That is why ... does not fit" only where it does not.

Chapters 11 and 12 compare architectures and measured runs of other models by design, and so does
a section marked ``{.other-models}`` on its heading; their vocabulary is not the book's model's and is
not checked.
"""
from __future__ import annotations

import re

import pytest

import book_prose as bp
from memlib import load_model
from memlib.config.model import preset_names
from memlib.model.blocks import BLOCK_NAMES, VOCABULARY, lacking, model_blocks, words_of_lacking_blocks
from memlib.report.book import book_blocks, book_tags

PRESETS = preset_names()
CHAPTERS = [p.name for p in bp.NOTEBOOKS]
#: chapters whose subject is other models than the book's (their vocabulary is not checked)
COMPARATIVE = {"11_measured_peaks.md", "12_other_architectures.md"}


def chapter(model: str, name: str) -> bp.Chapter:
    return next(c for c in bp.book(model) if c.name == name)


# --- the table itself -------------------------------------------------------------------------------------------

def test_the_blocks_of_each_family():
    """Hand-read from the model cards: V3 has every DeepSeek block (MTP, router bias, 3 dense layers), V2
    neither MTP nor the bias, V2-Lite no query compression but the RoPE split; Mixtral is GQA and MoE
    without shared experts or dense layers; Llama is dense GQA."""
    blocks = {m: model_blocks(load_model(m)) for m in ("deepseek-v3", "deepseek-v2", "deepseek-v2-lite", "mixtral-8x7b",
                                                        "llama-3-8b", "qwen3-30b-a3b")}
    assert blocks["deepseek-v3"] == {"mla", "q_latent", "rope_split", "moe", "shared_experts", "router_bias", "mtp",
                                     "dense_layers"}
    assert blocks["deepseek-v2"] == {"mla", "q_latent", "rope_split", "moe", "shared_experts", "dense_layers"}
    assert blocks["deepseek-v2-lite"] == blocks["deepseek-v2"] - {"q_latent"}
    assert blocks["mixtral-8x7b"] == blocks["qwen3-30b-a3b"] == {"gqa", "moe"}
    assert blocks["llama-3-8b"] == {"gqa", "dense_layers"}
    assert book_blocks("deepseek-v3") == blocks["deepseek-v3"] | {"paper"}
    assert set(VOCABULARY) == set(BLOCK_NAMES)


def test_the_words_of_a_lacking_block_are_found():
    text = "Mixtral's MLA block, its latent c^{KV}, the shared experts and 1 MTP module; grouped-query attention."
    found = words_of_lacking_blocks(text, load_model("mixtral-8x7b"))
    assert [b for b, _ in found] == ["mla", "mla", "mla", "shared_experts", "mtp"]
    assert words_of_lacking_blocks(text, load_model("deepseek-v3"), paper=True) == [("gqa", "grouped-query")]


# --- every preset, every chapter ------------------------------------------------------------------------------

@pytest.mark.parametrize("model", PRESETS)
def test_every_chapter_computes(model):
    errors = [(c.name, c.error) for c in bp.book(model) if c.error]
    assert errors == []
    unglued = [(c.name, k) for c in bp.book(model) for k in re.findall(r"<<unglued (\w+)>>", c.text)]
    assert unglued == []


def _cases():
    for model in PRESETS:
        for name in CHAPTERS:
            if name in COMPARATIVE:
                continue
            yield pytest.param(model, name, id=f"{model}-{name[:2]}")


@pytest.mark.parametrize("model,name", list(_cases()))
def test_no_word_of_a_block_the_model_lacks(model, name):
    m = load_model(model)
    text = bp.own_text(chapter(model, name).text)
    found = words_of_lacking_blocks(text, m, paper="paper" in book_blocks(model))
    context = [text[max(0, text.find(w) - 60): text.find(w) + 40].replace("\n", " ") for _, w in found[:5]]
    assert found == [], (sorted(lacking(m, "paper" in book_blocks(model))), context)


@pytest.mark.parametrize("model", PRESETS)
def test_every_config_field_the_notation_names_is_the_models(model):
    """Chapter 2's notation names, for each dimension, the config.json field it is read from: a field the model's
    own config has or its family reads (Mixtral's expert width is ``intermediate_size`` and its experts
    ``num_local_experts``; Llama and Mixtral have no ``first_k_dense_replace``, no ``n_group``)."""
    import json
    from pathlib import Path

    from memlib.config import family_of

    d = json.loads((Path(bp.ROOT) / "memlib" / "presets" / f"{model}.json").read_text())
    fam = family_of(d, model)
    read = set(d) | {hf for _, hf, _ in fam.fields if hf}
    named = re.findall(r"\| `(\w+)` \|", chapter(model, "02_architecture.md").glued["arch_notation"])
    assert named and [f for f in named if f not in read] == []


#: sentences no person would write: a count of zero things or a plural hedged with "(s)"
NONSENSE = [
    r"\w\(s\)",
    r"\b(?:states|gives|prints) 0 figures?\b",
    r"\b0 (?:modules?|MTP modules?|figures?|places|shared experts?)\b",
    r"differ(?:s)? in (?:three|two|\d+) places?[^.]*?\b0 fewer",
    r"\bstages? none\b",
    r"\$?P_\{?\\?(?:mathrm\{)?FFN\}?\}?\s*=\s*0\s*\$?$",
    r"\b0 (?:MoE layers?|routed experts?|experts?)\b",
    # an equation whose right-hand side is a count times zero ("P^{repl}_{GQA} = L^{MoE}_{st} 0")
    r"=\s*(?:\w\^\{[^}]*\}_\{[^}]*\}\s*)?0\s*\$?$",
    # nothing to compare, said instead of left out
    r"publishes no parameter counts", r"does not locate it here",
    # a singular subject with a plural verb ("The router stay whole", "the router shard over EDP")
    r"\b[Tt]he router (?:stay|shard)\b",
    # a count compared with itself ("20 of 20 combinations fit instead of 20"), a list that lists nothing
    r"\b(\d+) of \d+ combinations fit instead of \1\b", r"fit: every one of them",
    # a rise from a value to the same printed value ("rise with EP, from 0.59 GiB at EP = 1 to 0.59 GiB at EP = 8")
    r"from (\d[\d,.]* [KMG]iB) at [^;]*? to \1 at",
    # the only source of a count said again in its own parenthesis ("on 2 training steps ... (2 from ...)")
    r"on (\d+) training steps[^()]*\(\1 from",
    # a capacity in parentheses inside parentheses ("the H800 (81,559 MiB (79.65 GiB))")
    r"\(\d[\d,]* MiB \([\d.]+ GiB\)\)",
    # one thing said twice in one sentence ("leaves the fastest step as it is ...; on N GPUs it leaves the fastest
    # step as it is")
    r"(leaves the fastest step as it is)[^.]*;[^.]*\1",
    # a count of nothing ("transformers holds 0 buffer elements beside them")
    r"\b0 buffer (?:elements?|s)\b",
    # a small count in running prose written as a digit ("1 MTP module", "all 3 cases match", "its 4 layers"):
    # core.words.number_word writes them as words
    r"\b(?:all|its|the|has|holds|carries|beside its) [1-9] (?:cases?|MTP modules?|decoder layers?|MoE layers?|"
    r"layers|configurations?|groups?|matrices|shared experts?|key-value heads|score-sized)\b",
    r"\b[1-9] (?:times as many|MTP modules?)\b",
]

@pytest.mark.parametrize("model", PRESETS)
def test_no_sentence_no_person_would_write(model):
    found = []
    for c in bp.book(model):
        for pattern in NONSENSE:
            for m_ in re.finditer(pattern, c.text, flags=re.M | re.S):
                found.append((c.name, c.text[max(0, m_.start() - 60): m_.end() + 20].replace("\n", " ")))
    assert found == []


# --- verdicts ---------------------------------------------------------------------------------------------------

_GIB = r"(\d[\d,]*\.\d+) GiB"


def _verdicts(text: str):
    """(peak GiB, 'fits' or 'does not fit', the sentence) for each clause that states a peak and its verdict."""
    flat = re.sub(r"\s+", " ", text)
    for m_ in re.finditer(rf"peaks? at {_GIB}(?: with [\w-]+(?: and [\w -]+?)?)?,? (?:and|so it|so) (fits|does not fit)",
                          flat):
        yield float(m_.group(1).replace(",", "")), m_.group(2), m_.group(0)


def _capacity_gib() -> float:
    from memlib.scenarios.overheads import CAPACITY_80GB

    return CAPACITY_80GB / 2**30


@pytest.mark.parametrize("model", PRESETS)
def test_every_fit_verdict_agrees_with_its_peak(model):
    cap = _capacity_gib()
    wrong = [(c.name, s) for c in bp.book(model) for peak, verdict, s in _verdicts(c.text)
             if (verdict == "fits") != (peak <= cap + 0.005)]
    assert wrong == []


@pytest.mark.parametrize("model", PRESETS)
def test_a_causal_sentence_only_where_its_verdict_holds(model):
    """"That is why ... peaks at X and fits" is the sentence copied from a book where it did not fit."""
    found = [(c.name, s[:160]) for c in bp.book(model)
             for s in re.findall(r"That is why[^.]*?(?:\.\d+[^.]*?)*\bfits\b", re.sub(r"\s+", " ", c.text))]
    assert found == []


# --- what a chapter is about --------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", [p for p in PRESETS if "paper" not in book_blocks(p)])
def test_no_chapter_title_says_what_deepseek_v3_does(model):
    """Chapter 9 was titled "How DeepSeek-V3 trains without tensor parallelism" in every book, while another
    model's chapter applies DeepSeek-V3's recipe to that model: a title may name the recipe, not claim what
    DeepSeek-V3 does."""
    titles = [(c.name, t) for c in bp.book(model) for t in re.findall(r"^# (.+)$", c.text, flags=re.M)]
    assert titles and [t for t in titles if re.search(r"\bDeepSeek-V3 (?:trains|fits|runs|uses)\b", t[1])] == []


@pytest.mark.parametrize("model", [p for p in PRESETS if "paper" not in book_blocks(p)])
def test_errata_with_nothing_to_compare_state_no_assumptions_about_it(model):
    """Another model's book has no errata (they are the paper's DeepSeek-V3 numbers): its chapter 14 says where they
    are and does not go on to assume things about the paper's units and transcriptions."""
    text = chapter(model, "14_errata.md").text
    assert "make book" in text
    assert "## What we assume" not in text and "printed values are the paper's" not in text


@pytest.mark.parametrize("model", [p for p in PRESETS if "deepseek_arch" not in book_tags(p)])
def test_a_record_of_deepseek_style_runs_alone_is_the_deepseek_books(model):
    """Chapter 10's GPU record of the transformers measurement ran DeepSeek-style configurations only (MLA widths,
    shared experts): another architecture's book leaves the section out rather than table symbols it never
    defines."""
    assert "v3-widths" not in chapter(model, "10_validation.md").text


@pytest.mark.parametrize("model", PRESETS)
def test_mla_is_spelled_out_where_chapter_12_first_names_it(model):
    """Chapter 12 compares MLA with GQA in every book; a book without MLA never defined it (chapter 2's section is
    dropped there), so the chapter spells it out at its first use, and defines its symbols before its equations."""
    text = chapter(model, "12_other_architectures.md").text
    first = text.find("MLA")
    spelled = re.sub(r"\s+", " ", text[:first]).endswith("multi-head latent attention (")
    assert first > 0 and spelled, text[max(0, first - 80): first + 5]
    if "deepseek_arch" not in book_tags(model):
        before = text[:text.find("M^{A}_{\\mathrm{MLA}}")]
        for symbol in ("$c^{KV}$", "$W^{UK}$", "$d_c$", "$c^Q$", "$d_c'$", "$q^R$", "$k^R$", "$d^R_h$"):
            assert symbol in before, symbol


def test_section_marks_are_read_as_the_build_reads_them():
    """tests/book_prose follows book/_ext: a heading may carry several classes, a tag class drops its section where
    the tag is not set, ``other-models`` keeps it between sentinels, and a section right after a dropped one is read
    for what it is (it was taken as the book's model's text, or dropped with the one before)."""
    src = ["## A", "a", "", "{.deepseek-arch .other-models}", "## B", "b", "", "{.other-models}", "## C", "c", "",
           "## D", "d"]
    bare = bp._drop_sections(src, set())
    assert "b" not in bare and bare[bare.index(bp.OPEN):bare.index(bp.CLOSE)] == [bp.OPEN, "## C", "c", ""]
    tagged = bp._drop_sections(src, {"deepseek_arch"})
    assert tagged.count(bp.OPEN) == 2 and "b" in tagged
    assert bp.own_text("\n".join(tagged)).split() == ["##", "A", "a", "##", "D", "d"]
