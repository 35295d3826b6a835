"""Summarise py-spy's collapsed stacks (``py-spy record --format raw``): where the samples go.

Prints the share of samples per package (the frame's file: a site-packages distribution, the
standard library, cacheon's own module, or a native library), the top frames by self time (the
innermost frame, by line) and the top functions by inclusive time (anywhere on the stack), each as a
percentage of all samples in the file (or under ``--under``).

    python benchmarks/pyspy_top.py PROFILE.txt [--top 15] [--under FUNCTION]

``--under`` keeps only stacks through a frame whose text contains FUNCTION (e.g. ``proxy``), so
the shares are of that path alone.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def package(file: str) -> str:
    """A frame's owner: ``site-packages/<dist>``, ``cacheon/<module>``, the standard library, or native."""
    if "site-packages/" in file:
        return file.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/cacheon/" in file:
        return "cacheon/" + file.split("/cacheon/", 1)[1].removesuffix(".py")
    if "/lib/python3" in file:
        return "stdlib/" + file.rsplit("/", 1)[-1].removesuffix(".py")
    return file or "native"


def label(frame: str, line: bool = True) -> str:
    """``function (package:line)``; without ``line``, one entry per function (inclusive time)."""
    m = FRAME.match(frame)
    if not m:
        return frame
    return f"{m['func']} ({package(m['file'])}{':' + m['line'] if line and m['line'] else ''})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--under", help="only stacks through a frame containing this text")
    args = parser.parse_args()
    try:
        lines = args.profile.read_text().splitlines()
    except OSError as exc:
        raise SystemExit(f"cannot read {args.profile}: {exc.strerror}") from None
    own, inclusive, packages = Counter(), Counter(), Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if args.under and not any(args.under in f for f in frames):
            continue
        n = int(count)
        total += n
        own[label(frames[-1])] += n
        packages[package(FRAME.match(frames[-1])["file"]) if FRAME.match(frames[-1]) else "native"] += n
        for name in {label(f, line=False) for f in frames}:
            inclusive[name] += n
    if not total:
        raise SystemExit(f"no samples in {args.profile}" + (f" under {args.under!r}" if args.under else ""))
    print(f"{total} samples" + (f" through {args.under!r}" if args.under else ""))
    for title, counts in (("self time by package", packages), ("self time by frame", own),
                          ("inclusive time by frame", inclusive)):
        print(f"\n{title}:")
        for name, n in counts.most_common(args.top):
            print(f"  {100 * n / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
