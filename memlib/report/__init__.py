"""The book's presentation layer: it formats, tabulates and draws what the library computes.

Shared helpers, in the order a chapter uses them:

* :mod:`.book` -- the model and configurations a build is for (``MEMLIB_BOOK_MODEL``);
* :mod:`.format` -- numbers and units as text (GiB and GB never mixed), Markdown tables, LaTeX;
* :mod:`.glue` -- myst-nb ``glue`` of values, paper values and numbered equations;
* :mod:`.tables` -- the notation recap and the errata tables;
* :mod:`.figures` -- the style, the colours of each category, block and policy, stacked bars.

Then one module per chapter, ``chNN_<topic>``, that turns the results of :mod:`memlib.paper` and
:mod:`memlib.scenarios` into the strings, tables and figures its notebook glues.  A chapter
module imports the library and the shared helpers above, never another chapter module; nothing
here does arithmetic on memory (see ``docs/writing-a-chapter.md``).  :mod:`.readme` draws the
README's figure.
"""
