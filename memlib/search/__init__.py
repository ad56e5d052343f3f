"""The search: the estimate's terms compiled into exact vectorised functions, and every configuration of N GPUs that fits.

:mod:`~memlib.search.vectorised` is exact rational arithmetic on NumPy arrays;
:mod:`~memlib.search.compiled` compiles the estimate's expressions onto it and evaluates a family of
configurations at once, to the byte of :func:`~memlib.device.estimate.estimate`;
:mod:`~memlib.search.plan` enumerates, filters and ranks them (``memlib plan``).
"""
