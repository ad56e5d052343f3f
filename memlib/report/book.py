"""The book's configuration: which model it is built for.

``make book MODEL=deepseek-v2`` (any preset name or config.json path) builds the whole book for that
model: it sets ``MEMLIB_BOOK_MODEL``, which every chapter's configuration cell reads through
:data:`BOOK_MODEL`, and which the book's Sphinx extension (``book/_ext/memlib_book.py``) reads to
set the tag ``paper_model`` when the model is the paper's DeepSeek-V3 (prose that compares with the
paper is written inside ``{only} paper_model`` blocks).
"""
from __future__ import annotations

import os

__all__ = ["BOOK_MODEL", "ENV", "book_tags", "book_blocks"]

ENV = "MEMLIB_BOOK_MODEL"

#: the model the book is built for (``deepseek-v3`` unless ``make book MODEL=...``)
BOOK_MODEL = os.environ.get(ENV) or "deepseek-v3"


def book_blocks(model: str = BOOK_MODEL) -> frozenset[str]:
    """The optional blocks of ``model`` (:func:`memlib.model.blocks.model_blocks`), ``paper`` among
    them when it is the paper's model."""
    from ..config import load_model
    from ..model.blocks import model_blocks
    from ..paper import is_paper_model

    m = load_model(model)
    return model_blocks(m, paper=is_paper_model(m))


def book_tags(model: str = BOOK_MODEL) -> set[str]:
    """The Sphinx tags of a build for ``model``: ``paper_model`` when it is the paper's,
    ``deepseek_arch`` when it has the blocks the paper analyses (MLA, DeepSeekMoE): the sections on
    them are marked ``{.deepseek-arch}`` and dropped from another architecture's book; and
    ``has_BLOCK`` for each optional block it has (:data:`memlib.model.blocks.BLOCK_NAMES`: ``has_mtp``,
    ``has_shared_experts``, ...), for ``{only} has_mtp`` blocks and sections marked ``{.has-mtp}``; and
    ``deepseek_figures`` when DeepSeek states parameter counts for it (:func:`memlib.paper.parameters.official`)."""
    from ..model.architecture import is_deepseek_architecture
    from ..config import load_model
    from ..paper import is_paper_model

    from ..paper.parameters import official

    tags = {"paper_model"} if is_paper_model(model) else set()
    tags |= {f"has_{b}" for b in book_blocks(model)}
    tags |= {"deepseek_figures"} if official(model) else set()
    return tags | ({"deepseek_arch"} if is_deepseek_architecture(load_model(model)) else set())


#: a section class of the chapters' headings (``{.deepseek-arch}``) and the build tag it stands for; ``has-BLOCK``
#: stands for ``has_BLOCK`` (book/_ext/memlib_book.py drops a section whose tag is not set)
SECTION_CLASSES = {"paper-model": "paper_model", "deepseek-arch": "deepseek_arch", "html-only": "html"}


def section_tag(cls: str) -> str | None:
    """The tag a section class stands for (:data:`SECTION_CLASSES`, ``has-BLOCK``), None for another class."""
    if cls in SECTION_CLASSES:
        return SECTION_CLASSES[cls]
    return cls.replace("-", "_") if cls.startswith("has-") else None


def equation_numbers(model: str = BOOK_MODEL, builder: str = "html") -> dict[str, str]:
    """The number each displayed equation gets in ``model``'s book (``builder`` ``html`` or ``latex``): registry
    formula name -> ``"N.k"``, the k-th equation its chapter N keeps.  A chapter leaves out an equation inside an
    ``{only}`` block whose condition is false, or under a heading whose section class's tag is not set, and Sphinx
    numbers what is left; this reads the chapters' sources in the table of contents' order the same way.  Empty
    where the sources are not there (an installed memlib without the book)."""
    import re
    from pathlib import Path

    import yaml
    from sphinx.util.tags import Tags

    root = Path(__file__).resolve().parents[2]
    toc_file = root / "_toc.yml"
    if not toc_file.is_file():
        return {}
    tags = Tags(sorted(book_tags(model) | {builder}))
    toc = yaml.safe_load(toc_file.read_text(encoding="utf-8"))
    chapters = [root.joinpath(c["file"]).with_suffix(".md") for part in toc["parts"] for c in part["chapters"]]
    fence = re.compile(r"^(`{3,}|:{3,})(.*)$")
    out: dict[str, str] = {}
    for number, path in enumerate(chapters, start=1):
        fences: list[tuple[str, bool]] = []       # (the fence's marks, whether its content is shown)
        sections: list[tuple[int, bool]] = []     # (heading level, shown)
        pending: list[str] = []
        shown_keys: list[str] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            mo = fence.match(line)
            if mo:
                marks, info = mo.group(1), mo.group(2).strip()
                if not info and fences and marks[0] == fences[-1][0][0] and len(marks) >= len(fences[-1][0]):
                    fences.pop()
                    continue
                if info:
                    shown = True
                    if info.startswith("{only}"):
                        shown = tags.eval_condition(info[len("{only}"):].strip())
                    fences.append((marks, shown))
                    if info.startswith("{glue:math}") and all(s for _, s in fences) and all(s for _, s in sections):
                        shown_keys.append(info.split()[1])
                continue
            cls = re.fullmatch(r"\{((?:\.[\w-]+\s*)+)\}", line.strip())
            if cls and not fences:
                pending = re.findall(r"\.([\w-]+)", cls.group(1))
                continue
            heading = re.match(r"^(#{1,6}) ", line)
            if heading and not fences:
                level = len(heading.group(1))
                while sections and sections[-1][0] >= level:
                    sections.pop()
                wanted = [section_tag(c) for c in pending]
                sections.append((level, all(t is None or tags.eval_condition(t) for t in wanted)))
                pending = []
        out.update({key: f"{number}.{k}" for k, key in enumerate(shown_keys, start=1)})
    return out
