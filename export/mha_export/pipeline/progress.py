"""Progress bars for the long steps of an export (tqdm): on a terminal only, on stderr, never in a pipe or a log."""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def on_terminal() -> bool:
    """Bars are drawn only when both stdout and stderr are terminals: a redirected run stays quiet."""
    return sys.stdout.isatty() and sys.stderr.isatty()


def steps(items: Iterable[T], *, label: str, unit: str, enabled: bool,
          name: Callable[[T], str] | None = None) -> Iterator[T]:
    """Yield `items`, advancing a bar labelled `label` (showing `name(item)` as the current step) when `enabled`
    and on a terminal."""
    items = list(items)
    with tqdm(total=len(items), desc=label, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True,
              disable=not (enabled and on_terminal())) as bar:
        for item in items:
            if name is not None:
                bar.set_postfix_str(name(item), refresh=False)
            yield item
            bar.update()
