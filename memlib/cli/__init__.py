"""The ``memlib`` command line.

``memlib params``   parameter counts of a model (total, activated, MTP, per component).
``memlib estimate`` per-stage, per-device memory under a training configuration.
``memlib measure``  measured against predicted activation bytes (needs ``pip install memlib[measure]``;
                    ``--framework megatron-core`` also megatron-core 0.19.2).

Output with ``--json`` is a contract: keys are added by later versions, never renamed.  Bad input
prints one line on stderr naming the field, its value and the rule, and exits with code 2.

:mod:`~memlib.cli.parser` holds every sub-command's options, :mod:`~memlib.cli.options` turns them into
memlib's objects, and one module per sub-command runs it (:mod:`~memlib.cli.params`,
:mod:`~memlib.cli.estimate`, :mod:`~memlib.cli.plan`, :mod:`~memlib.cli.measure`, :mod:`~memlib.cli.formula`);
this module dispatches and exits.  :mod:`~memlib.cli.doc` writes ``docs/cli.md``'s option tables from the parser.
"""
from __future__ import annotations

import os
import sys

from ..config import ConfigError
from .estimate import _estimate
from .formula import _formula
from .measure import _measure
from .params import _params
from .parser import _parser
from .plan import _plan

__all__ = ["main", "run"]


def main(argv: list[str] | None = None) -> int:
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = _parser().parse_args(argv)
        args.argv = argv
        return {"params": _params, "estimate": _estimate, "formula": _formula,
                "measure": _measure, "plan": _plan}[args.command](args)
    except ConfigError as exc:
        print(f"memlib: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `memlib estimate | head`: the reader left; not an error of ours
        _reader_left()
        return 0


def _reader_left() -> None:
    """stdout's reader has gone: later writes (and the flush at exit) go to /dev/null, not to a broken pipe."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


#: the commands whose process may end without the interpreter's teardown (nothing of theirs needs it); measure
#: runs torch, whose exit handlers must run
_QUICK_EXIT = ("params", "estimate", "formula", "plan")


def run() -> None:
    """The ``memlib`` console script and ``python -m memlib``: :func:`main`, its output flushed, then the
    process ends.  A command of :data:`_QUICK_EXIT` skips the interpreter's teardown (freeing SymPy's caches
    and a search's arrays one object at a time takes a tenth of a second or more of a one-second answer)."""
    code = main()
    quick = len(sys.argv) > 1 and sys.argv[1] in _QUICK_EXIT
    try:
        sys.stdout.flush()
    except BrokenPipeError:          # the reader left (``memlib plan | head``): not an error of ours
        _reader_left()
    sys.stderr.flush()
    if quick:
        os._exit(int(code or 0))
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    run()
