"""A hot queryset's SQL compiled once per process, then run with new values.

Compiling a queryset is most of what a small ORM read costs here: a key
lookup or a session fetch with its agent (`select_related`) spends ~0.8-1 ms
of CPU building SQL against ~0.1 ms running it. `PreparedQuery` compiles the
queryset once, from example values, keeps the statement, the column
converters and Django's own row-to-model population, and then each call is one
`execute` plus that population: the same model instances (related objects
cached, converters applied, `_state` set) the ORM would have returned.

Only for querysets whose SQL does not depend on the values: plain equality
filters. The values must be passed in the form the database adapter takes
(a UUID, an int, a str), as the ORM would have prepared them; the examples
must differ from each other, and the first compilation checks that they come
back as the statement's parameters (in Django's order, which may not be the
filters'), so a queryset that adds or transforms a parameter fails at once.

It reads Django's SQL compiler internals (`select`, `klass_info`,
`get_converters`, `get_related_populators`); the versions it was written for
are in runtime/fastpaths/__init__.py. Off, each call runs the queryset through
the ORM.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators
from django.db.transaction import TransactionManagementError

from runtime import fastpaths

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class _Compiled:
    sql: str
    order: list[int]  # the statement's parameters, as positions in the call's values
    converters: list[tuple[int, list[Any], Any]]
    model: type[Model]
    init_list: list[str]
    start: int
    end: int
    populators: list[Any]
    for_update: bool


class PreparedQuery(Generic[M]):
    def __init__(self, build: Callable[..., QuerySet[M]], example: Sequence[Any]) -> None:
        self._build = build
        self._example = tuple(example)
        self._compiled: dict[str, _Compiled] = {}

    def _compile(self, using: str) -> _Compiled:
        queryset = self._build(*self._example)
        compiler = queryset.query.get_compiler(using=using)
        sql, params = compiler.as_sql()
        # Django orders the filters its own way: map each parameter to its value.
        if len(set(map(repr, self._example))) != len(self._example) or sorted(
            map(repr, params)
        ) != sorted(map(repr, self._example)):
            raise ValueError(
                f"prepared query parameters {params!r} are not the examples {self._example!r}"
            )
        order = [list(map(repr, self._example)).index(repr(p)) for p in params]
        select, klass_info = compiler.select, compiler.klass_info
        if klass_info is None or compiler.annotation_col_map:
            raise ValueError("a prepared query returns plain model rows")
        fields = [s[0] for s in select[0 : compiler.col_count]]
        converters = [
            (pos, convs, expr) for pos, (convs, expr) in compiler.get_converters(fields).items()
        ]
        select_fields = klass_info["select_fields"]
        start, end = select_fields[0], select_fields[-1] + 1
        return _Compiled(
            sql=sql,
            order=order,
            converters=converters,
            model=klass_info["model"],
            init_list=[f[0].target.attname for f in select[start:end]],
            start=start,
            end=end,
            # (Django 5.2 signature; the stubs describe a later one)
            populators=get_related_populators(klass_info, select, using),  # type: ignore[call-arg]
            for_update=queryset.query.select_for_update,
        )

    def first(self, *values: Any, using: str = "default") -> M | None:
        """The first row as a model instance (with its select_related objects), or None."""
        if not fastpaths.enabled("prepared_queries"):
            return next(iter(self._build(*values).using(using)[:1]), None)
        compiled = self._compiled.get(using)
        if compiled is None:
            compiled = self._compiled[using] = self._compile(using)
        connection = connections[using]
        if compiled.for_update and connection.get_autocommit():
            raise TransactionManagementError(
                "select_for_update cannot be used outside of a transaction."
            )
        with connection.cursor() as cursor:
            cursor.execute(compiled.sql, [values[i] for i in compiled.order])
            fetched = cursor.fetchone()
        if fetched is None:
            return None
        row = list(fetched)
        for pos, convs, expression in compiled.converters:
            value = row[pos]
            for converter in convs:
                value = converter(value, expression, connection)
            row[pos] = value
        obj = compiled.model.from_db(using, compiled.init_list, row[compiled.start : compiled.end])
        for populator in compiled.populators:
            populator.populate(row, obj)
        return obj  # type: ignore[return-value]
