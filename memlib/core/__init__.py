"""The leaves every other package uses: byte units, the notation registry, the Breakdown type and its exact compiler.

:mod:`~memlib.core.units` formats and parses byte counts (GiB and GB kept apart),
:mod:`~memlib.core.symbols` defines every symbol once, :mod:`~memlib.core.breakdown` is the ordered set
of named SymPy terms every result is, :mod:`~memlib.core.exact` compiles such terms into exact
Python arithmetic, and :mod:`~memlib.core.words` joins the items of a sentence.
Nothing here knows about models or devices.
"""
