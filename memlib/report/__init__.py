"""Report helpers for the book: glue formatted numbers, render tables and equations, draw figures.

Notebooks call these and do no arithmetic of their own.  :mod:`.core` holds the generic helpers
(glue, Markdown tables, figure style); the other modules build the tables of one topic each.
"""
from .core import *  # noqa: F401,F403
from .core import __all__  # noqa: F401
