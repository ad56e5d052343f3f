"""``docs/cli.md``'s option tables, generated from the argument parser.

``docs/cli.md`` is prose written by hand around blocks that this module writes: each block between
``<!-- generated: NAME -->`` and ``<!-- end generated -->`` is replaced by :func:`block` ``(NAME)``, where
NAME is ``commands`` (the sub-commands) or a sub-command's name (its options, their defaults and help, as
:func:`memlib.cli.parser._parser` defines them).  Whoever adds or changes an option runs::

    python -m memlib.cli.doc            # rewrites docs/cli.md
    python -m memlib.cli.doc --check    # exits 1 when docs/cli.md disagrees with the parser

and ``tests/cli/test_cli_doc.py`` fails until they have.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .parser import _parser

__all__ = ["DOC", "subcommands", "option_rows", "block", "render"]

#: the CLI reference, in a checkout (a development file: an installed memlib has no docs/)
DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

_BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->\n)(.*?)(<!-- end generated -->)", re.S)


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def subcommands(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    """Each sub-command's parser, by name, in the order the parser defines them."""
    return dict(_subparsers(parser or _parser()).choices)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", r"\|")


def _default(action: argparse.Action) -> str:
    d = action.default
    if d is None or d is argparse.SUPPRESS or isinstance(d, bool) or d in ((), []):
        return ""
    return f"`{getattr(d, 'value', d)}`"


def option_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """(option as it is typed, default, help) of every option and argument of ``parser`` but ``--help``."""
    fmt = argparse.HelpFormatter(parser.prog, width=10_000)
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        typed = fmt._format_action_invocation(action)
        if action.required and action.option_strings:
            typed += " (required)"
        rows.append((f"`{typed}`", _default(action), _cell(action.help or "")))
    return rows


def block(name: str, parser: argparse.ArgumentParser | None = None) -> str:
    """The Markdown of the generated block ``name``: ``commands`` or a sub-command's options."""
    parser = parser or _parser()
    subs = subcommands(parser)
    if name == "commands":
        lines = ["| command | what it does |", "|---|---|"]
        lines += [f"| [`memlib {a.dest}`](#memlib-{a.dest}) | {_cell(a.help or '')} |"
                  for a in _subparsers(parser)._choices_actions]
        return "\n".join(lines) + "\n"
    if name not in subs:
        raise KeyError(f"docs/cli.md has a generated block {name!r}, which is neither 'commands' nor a sub-command "
                       f"({', '.join(subs)})")
    lines = ["| option | default | meaning |", "|---|---|---|"]
    lines += [f"| {a} | {d} | {h} |" for a, d, h in option_rows(subs[name])]
    return "\n".join(lines) + "\n"


def render(text: str, parser: argparse.ArgumentParser | None = None) -> str:
    """``text`` with every generated block rewritten from the parser; every sub-command must have one."""
    parser = parser or _parser()
    names = [m.group(2) for m in _BLOCK.finditer(text)]
    missing = [n for n in subcommands(parser) if n not in names]
    if missing:
        raise KeyError(f"docs/cli.md has no generated block for {', '.join(missing)}: add "
                       f"'<!-- generated: NAME -->' and '<!-- end generated -->' lines where its options go")
    return _BLOCK.sub(lambda m: m.group(1) + block(m.group(2), parser) + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(prog="python -m memlib.cli.doc", description=__doc__.splitlines()[0])
    args.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md is not what the parser gives")
    args.add_argument("--path", type=Path, default=DOC, help="the file (default docs/cli.md of this checkout)")
    a = args.parse_args(argv)
    old = a.path.read_text(encoding="utf-8")
    new = render(old)
    if a.check:
        if new != old:
            print(f"{a.path} is stale: run python -m memlib.cli.doc", file=sys.stderr)
            return 1
        return 0
    if new != old:
        a.path.write_text(new, encoding="utf-8")
    print(f"{a.path}: {'rewritten' if new != old else 'current'}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
