"""The search: the estimate's terms compiled into exact vectorised functions, and every configuration of N GPUs that fits.

:mod:`~memlib.search.compiled` evaluates a family of configurations at once, to the byte of
:func:`~memlib.device.estimate.estimate`; :mod:`~memlib.search.plan` enumerates, filters and ranks them
(``memlib plan``).
"""
