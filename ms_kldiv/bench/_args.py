"""Argument types shared by the benchmark command lines. A bad value is an argparse error (the usage, the flag's name,
exit code 2) before anything is built or timed: never a traceback, an empty table, or a row timed under a name that
is not its own."""
import argparse
import math
import re
import textwrap


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every flag's help ends with its default; the description's and epilog's lines are wrapped one by one (the
    default joins them), so that a list such as the subcommands' keeps a line per entry, its wrapped text indented
    under the entry's text."""

    def _fill_text(self, text, width, indent):
        lines = []
        for line in text.splitlines():
            hang = re.match(r"\s+\S+\s{2,}", line)  # '  name    text': wrapped text goes under 'text'
            lines.append(textwrap.fill(line, width, initial_indent=indent, break_on_hyphens=False,
                                       subsequent_indent=indent + " " * (hang.end() if hang else 0)))
        return "\n".join(lines)


def _fail(message):
    return argparse.ArgumentTypeError(message)


def number(kind, low=None, high=None, above=None):
    """A type: a finite ``kind`` (int or float) in [``low``, ``high``] and > ``above`` (each bound optional)."""
    what = "an integer" if kind is int else "a number"
    if low is not None and high is not None:
        what += f" in [{low:g}, {high:g}]"
    else:
        what += "".join(f" {op} {bound:g}" for op, bound in ((">=", low), ("<=", high), (">", above))
                        if bound is not None)

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise _fail(f"{text!r} is not {what}") from None
        if not math.isfinite(value) or (low is not None and value < low) or (high is not None and value > high) \
                or (above is not None and value <= above):
            raise _fail(f"{text!r} is not {what}")
        return value
    parse.__name__ = kind.__name__  # what argparse names the type in its own messages
    return parse


def choice(valid, what="value"):
    """A type: one of ``valid``, as it is when the type is made (the parser is built)."""
    valid = tuple(valid)

    def parse(text):
        if text not in valid:
            raise _fail(f"invalid {what} {text!r} (choose from {', '.join(valid)})")
        return text
    return parse


def comma_list(item, allow_empty=False):
    """A type: comma-separated values, each parsed by ``item``; empty items are left out."""
    def parse(text):
        values = [item(part.strip()) for part in text.split(",") if part.strip()]
        if not values and not allow_empty:
            raise _fail("needs at least one value")
        return values
    return parse


def dims(*names):
    """A type: positive integers joined by 'x', one per name (``dims('N', 'V')``: '4096x32000' -> (4096, 32000))."""
    shape = " x ".join(names)

    def parse(text):
        parts = text.lower().split("x")
        try:
            values = tuple(int(p) for p in parts)
        except ValueError:
            values = ()
        if len(values) != len(names) or min(values) < 1:
            raise _fail(f"{text!r} is not {shape} (positive integers, e.g. {'x'.join(['16'] * len(names))})")
        return values
    return parse
