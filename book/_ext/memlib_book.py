"""Sphinx extension of the book: tags the build with what the model it is built for is.

``paper_model`` is set when the book is built for the paper's DeepSeek-V3 (the default); prose that
puts memlib's values beside the paper's printed ones sits in ``{only} paper_model`` blocks, so that
a book built for another model (``make book MODEL=deepseek-v2``) carries none of them.

An ``{only}`` block cannot hold a heading (Sphinx raises the section out of it, so it would stay in
every book).  A whole section that only the paper's book has is marked on its heading instead::

    {.paper-model}
    ## Errata for this chapter

and removed, with everything under it, when the tag is not set.

``deepseek_arch`` is set when the model has the blocks the paper analyses (MLA, DeepSeekMoE); a
section on them is marked ``{.deepseek-arch}`` and dropped from the book of another architecture
(Llama, Mixtral, Qwen, GPT), whose chapters say in a glued note what applies instead
(``{only} not deepseek_arch``).
"""

SECTION_CLASSES = {"paper-model": "paper_model", "deepseek-arch": "deepseek_arch"}


def _drop_sections(app, doctree) -> None:
    from docutils import nodes

    for cls, tag in SECTION_CLASSES.items():
        if app.tags.has(tag):
            continue
        for section in list(doctree.findall(nodes.section)):
            if cls in section["classes"] and section.parent is not None:
                section.parent.remove(section)


def setup(app):
    from memlib.report.book import book_tags

    for tag in book_tags():
        app.tags.add(tag)
    # before the table of contents and the labels are collected from the doctree (priority 500)
    app.connect("doctree-read", _drop_sections, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
