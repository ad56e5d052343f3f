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
