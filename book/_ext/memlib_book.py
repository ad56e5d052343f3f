"""Sphinx extension of the book: tags the build with what the model it is built for is.

``paper_model`` is set when the book is built for the paper's DeepSeek-V3 (the default); prose that
puts memlib's values beside the paper's printed ones sits in ``{only} paper_model`` blocks, so that
a book built for another model (``make book MODEL=deepseek-v2``) carries none of them.
"""


def setup(app):
    from memlib.report.book import book_tags

    for tag in book_tags():
        app.tags.add(tag)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
