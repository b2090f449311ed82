"""A read-only serializer's readable fields built once per class.

DRF builds a ModelSerializer's fields, and deep-copies them, for every instance: a third of
a millisecond of CPU per response here, more than the representation itself. The fields
hold no state of a response; they are bound once to an instance of the class, whose methods
they may call (a SerializerMethodField's), and that instance takes no context. The output is
the same dict DRF builds (tests/sessions/api/test_serializers.py).

It overrides DRF's `Serializer._readable_fields` (what `to_representation` iterates); the
versions it was written for are in runtime/fastpaths/__init__.py. Off, DRF builds them.
"""

from typing import Any

from runtime import fastpaths

_built: dict[type, list[Any]] = {}


# Mixed in before a read-only DRF serializer class. No docstring on purpose: the schema
# (drf-spectacular) would show an inherited one as every such serializer's description.
class FieldsBuiltOnce:
    @property
    def _readable_fields(self) -> Any:
        if not fastpaths.enabled("drf_fields"):
            return super()._readable_fields  # type: ignore[misc]
        cls = type(self)
        fields = _built.get(cls)
        if fields is None:
            fields = _built[cls] = list(super(FieldsBuiltOnce, cls())._readable_fields)  # type: ignore[misc]
        return fields
