"""One vocabulary of forms for every kind (torch-free): the row type and the one reader of `--variants`.

A form is one way of writing a model's files. The attention's variants (mha_runtime.attention.registry) and the
decoder's forms (mha_runtime.decoder.forms) are rows of one type; each kind's `--variants` names are one `Table`.
What the rows say is decided here once for both kinds: which names `--variants` takes (`parse`), what a chosen form
is built from, and which forms a config or this environment rules out, left out of 'all' with a note or refused when
named (`select`). Each kind words its own refusals (its users' lines predate this table).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from mha_runtime.artifact.errors import BadValueError, cut
from mha_runtime.artifact.tolerance import Tolerance

ALL, NONE = "all", "none"
# A condition on a kind's config and its one-line reason: why the config's shape cannot have the form, or None.
Refuses = Callable[[Any], str | None]


@dataclass(frozen=True, kw_only=True)
class FormRow:
    """One form: its `--variants` name, its (first) file, the forms it is built from (`needs`), why a config cannot
    have it (`refuses`), whether only a name asks for it ('all' leaves it out: `on_request`), whether it is always
    built (`core`: not a choice), and its bar: a tolerance row against eager, or for a lossy form a quality bar (the
    mean KL divergence from its fp32 form, `max_mean_kl`) and the row of the method that quantizes it (`method`: a key
    of mha_export.decoder.lossy.methods.METHODS)."""

    name: str
    file: str
    needs: tuple[str, ...] = ()
    refuses: Refuses | None = None
    on_request: bool = False
    core: bool = False
    tolerance: Tolerance | None = None
    max_mean_kl: float | None = None
    method: str | None = None

    @property
    def lossy(self) -> bool:
        return self.max_mean_kl is not None

    def meets_bar(self, mean_kl: float) -> bool:
        """Within the quality bar (a NaN never is)."""
        return self.max_mean_kl is not None and mean_kl <= self.max_mean_kl

    def missing(self) -> str | None:
        """What this environment lacks to build the form, or None (a kind whose forms need extras says)."""
        return None


F = TypeVar("F", bound=FormRow)


@dataclass(frozen=True)
class Table(Generic[F]):
    """One kind's forms in build order and how its `--variants` reads. `unknown` is the kind's line for a name it
    lacks (str.format fields: name and text, quoted and cut; choices, the names it takes; extras, its on-request
    names, comma-joined)."""

    rows: tuple[F, ...]
    unknown: str
    none: bool = False  # 'none' (or nothing) asks for no form beyond the core
    pull_needs: bool = True  # a form's needs are built with it; False: each must be asked for too
    # Names people ask for that cannot be built, with the reason.
    unbuildable: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        names = [r.name for r in self.rows]
        if len(set(names)) != len(names):
            raise ValueError(f"forms table: a name twice in {names}")
        unknown = sorted({n for r in self.rows for n in r.needs} - set(names))
        if unknown:
            raise ValueError(f"forms table: needs {unknown} name no row")

    def __getitem__(self, name: str) -> F:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no form named {name!r}; forms: {', '.join(r.name for r in self.rows)}")

    @property
    def choices(self) -> tuple[str, ...]:
        """The names `--variants` takes (the core is always built)."""
        return tuple(r.name for r in self.rows if not r.core)

    @property
    def default(self) -> tuple[str, ...]:
        """What 'all' asks for: every choice but those only a name asks for."""
        return tuple(r.name for r in self.rows if not r.core and not r.on_request)


@dataclass(frozen=True)
class Chosen:
    """What `--variants` asked for: 'all' (`every`) and the names given besides, in table order."""

    every: bool
    names: tuple[str, ...]


def parse(text: str | Iterable[str], table: Table[Any]) -> Chosen:
    """'fused,int8' -> those names; 'all' -> every default form (and, with it, the on-request names given); 'none' or
    nothing -> no form, where the table allows it. A name the table lacks is refused in one line, before any work."""
    given = text if isinstance(text, str) else ",".join(text)
    names = [n.strip() for n in given.split(",") if n.strip()]
    if table.none and names in ([], [NONE]):
        return Chosen(False, ())
    for name in names or [""]:
        if name in table.unbuildable:
            raise BadValueError(f"variant {name!r} cannot be built: {table.unbuildable[name]}")
        if name != ALL and name not in table.choices:
            extras = ",".join(r.name for r in table.rows if r.on_request)
            raise BadValueError(table.unknown.format(name=repr(cut(name)), text=repr(cut(given)), extras=extras,
                                                     choices=", ".join(table.choices)))
    return Chosen(ALL in names, tuple(n for n in table.choices if n in names))


def closure(table: Table[F], names: Iterable[str]) -> tuple[F, ...]:
    """The core, the named forms and everything they are built from, in build order."""
    chosen = {r.name for r in table.rows if r.core} | set(names)
    pending = list(chosen)
    while pending:
        for need in table[pending.pop()].needs:
            if need not in chosen:
                chosen.add(need)
                pending.append(need)
    return tuple(r for r in table.rows if r.name in chosen)


# Why a config rules a row out beyond the row's own rule (a decoder architecture's reason), or None.
Also = Callable[[Any], str | None]


def refusal(table: Table[Any], row: FormRow, config: object, also: Also | None = None) -> tuple[str, bool] | None:
    """Why `row` cannot be built for `config` here, and whether the config rules it out (else this environment
    lacks something): its own reason, else `also`'s (called with the row), else the first of a form it is built
    from."""
    own = row.refuses(config) if row.refuses is not None else None
    if own is None and also is not None:
        own = also(row)
    if own is not None:
        return own, True
    lacks = row.missing()
    if lacks is not None:
        return lacks, False
    return next((why for need in row.needs if (why := refusal(table, table[need], config, also))), None)


@dataclass(frozen=True)
class Selection(Generic[F]):
    """What a choice comes to for one config: the forms to build (build order), those 'all' leaves out (with why),
    those asked for by name that cannot be built (with why, and whether the config rules them out rather than this
    environment), and the needs a named form lacks where the table wants them named (form, need)."""

    rows: tuple[F, ...]
    left_out: tuple[tuple[F, str], ...] = ()
    refused: tuple[tuple[F, str, bool], ...] = ()
    unmet: tuple[tuple[F, str], ...] = ()


def select(table: Table[F], chosen: Chosen, config: object, *, also: Also | None = None) -> Selection[F]:
    """The forms `chosen` asks of `config` here: a form 'all' brought that the config or environment cannot have is
    left out, one asked for by name (or built for one that was) is refused; a form one of them is built from shares
    its fate. `also`: a reason the caller adds to each row's own (refusal)."""
    named = closure(table, chosen.names) if table.pull_needs else tuple(table[n] for n in chosen.names)
    core = {r.name for r in table.rows if r.core}
    asked = core | {r.name for r in named} | (set(table.default) if chosen.every else set())
    rows = closure(table, asked) if table.pull_needs else tuple(r for r in table.rows if r.name in asked)
    kept: list[F] = []
    left: list[tuple[F, str]] = []
    refused: list[tuple[F, str, bool]] = []
    for row in rows:
        why = refusal(table, row, config, also)
        if why is None:
            kept.append(row)
        elif row in named:
            refused.append((row, *why))
        else:
            left.append((row, why[0]))
    names = {r.name for r in rows}
    unmet = tuple((r, n) for r in named for n in r.needs if n not in names)
    return Selection(tuple(kept), tuple(left), tuple(refused), unmet)
