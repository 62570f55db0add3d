"""Typed records to bytes and back, without :mod:`pickle`: reading builds only the classes
of an allow-list, by calling their constructors, and nothing else.

Unpickling runs whatever callable the bytes name, so a cache entry that is unpickled is
code. Here a document is JSON (read by the C parser) with a tag on everything that is not
a JSON scalar, and a :class:`Schema` maps each class tag to one class:

- ``None``, booleans, integers, floats and strings are themselves;
- ``["l", ...]``, ``["t", ...]``, ``["s", ...]``, ``["f", ...]``: a list, a tuple, a set,
  a frozenset of the items; ``["d", k0, v0, k1, v1, ...]``: a dict; ``["b", "base64"]``:
  bytes;
- ``[tag, v0, v1, ...]``: an instance of the schema's class ``tag``, from its fields in
  order (a record's or a dataclass's declared fields, a named tuple's, an enum's value);
- ``["@", n]``: the ``n``-th object read so far (in the order each one is finished), so
  objects shared when written are shared when read, as pickle keeps them.

The document is ``[FORMAT, [[tag, field names...], ...], value]``: the fields of every
class it uses, as the writer's classes declared them (and no JSON object anywhere). A
reader whose class declares other fields (another version of it) refuses the document, as
it refuses an unknown tag, an instance with another number of fields, and anything
malformed: :class:`SerialError` in every case.
"""

from __future__ import annotations

import binascii
import importlib
import json
from collections.abc import Callable
from typing import Any

from tensorwasm.support.records import builder

FORMAT = "tensorwasm-records-1"
_SCALARS = (type(None), bool, int, float, str)
_BUILTIN_TAGS = frozenset({"l", "t", "s", "f", "d", "b", "@"})


class SerialError(ValueError):
    """A value the schema cannot write, or a document it cannot read."""


class Custom:
    """How to write and read a class that is neither a record, a dataclass, a named tuple
    nor an enum: ``fields`` are read from an instance and given, in order, to ``make``
    (the class itself where None); ``state`` are set on the new instance afterwards (what
    its constructor computes afresh, such as a counter's number, but must keep)."""

    __slots__ = ("fields", "make", "state")

    def __init__(self, fields: tuple[str, ...], make: Callable | None = None, state: tuple[str, ...] = ()):
        self.fields = fields
        self.make = make
        self.state = state


class _Class:
    """One allowed class, resolved: its fields and how an instance is built from them."""

    __slots__ = ("cls", "fields", "make", "state", "values", "width")

    def __init__(self, cls: type, custom: Custom | None):
        import enum

        self.cls = cls
        self.state: tuple[str, ...] = ()
        if custom is not None:
            self.fields, self.state = custom.fields, custom.state
            self.make = custom.make or cls
            self.values = _attributes(custom.fields + custom.state)
        elif isinstance(cls, enum.EnumMeta):
            self.fields, self.make, self.values = ("value",), cls, _enum_value
        elif hasattr(cls, "__record_fields__"):
            self.fields, self.make, self.values = tuple(cls.__record_fields__), builder(cls), _record_values
        elif hasattr(cls, "__dataclass_fields__"):
            import dataclasses

            self.fields = tuple(f.name for f in dataclasses.fields(cls) if f.init)
            self.make, self.values = cls, _attributes(self.fields)
        elif issubclass(cls, tuple) and hasattr(cls, "_fields"):
            self.fields, self.make, self.values = tuple(cls._fields), cls, tuple
        else:
            raise SerialError(
                f"{cls.__qualname__}: not a record, dataclass, named tuple or enum; say how (Custom)"
            )
        self.width = len(self.fields) + len(self.state)

    @property
    def names(self) -> list[str]:
        """What an instance is written as: its fields, then its state."""
        return [*self.fields, *self.state]


def _enum_value(obj: Any) -> tuple:
    return (obj.value,)


def _record_values(obj: Any) -> tuple:
    # The fields the instance holds: one that lacks a field (written by another version of
    # its class) is written short, and refused when read.
    state = obj.__dict__
    return tuple(state[name] for name in type(obj).__record_fields__ if name in state)


def _attributes(names: tuple[str, ...]) -> Callable[[Any], tuple]:
    def values(obj: Any) -> tuple:
        return tuple(getattr(obj, name) for name in names)

    return values


class Schema:
    """The classes a document may hold: each is ``module`` and class name, written under
    the class's name as its tag (two allowed classes may not share a name). A class is
    imported the first time a document uses it, so a reader loads only the modules its
    documents need."""

    def __init__(self, classes: dict[str, tuple[str, ...]], custom: dict[str, Custom] | None = None):
        self._where: dict[str, str] = {}
        for module, names in classes.items():
            for name in names:
                if name in self._where or name in _BUILTIN_TAGS:
                    raise ValueError(f"the tag {name!r} is taken")
                self._where[name] = module
        self._custom = custom or {}
        self._resolved: dict[str, _Class] = {}

    def resolve(self, tag: str) -> _Class:
        """The allowed class written under ``tag``; SerialError for a tag not allowed."""
        found = self._resolved.get(tag)
        if found is not None:
            return found
        module = self._where.get(tag) if type(tag) is str else None
        if module is None:
            raise SerialError(f"{tag!r} is not an allowed class")
        try:
            cls = getattr(importlib.import_module(module), tag)
        except (ImportError, AttributeError) as exc:
            raise SerialError(f"the allowed class {module}.{tag} is not there: {exc}") from exc
        found = self._resolved[tag] = _Class(cls, self._custom.get(tag))
        return found

    def dumps(self, value: Any, substitute: Callable[[Any], Any] | None = None) -> bytes:
        """``value`` as a document. ``substitute`` (where given) is asked for every object
        that is not a scalar or a builtin container, and what it returns is written in its
        place (a stand-in for an object outside the schema, say)."""
        writer = _Writer(self, substitute)
        body = writer.write(value)
        tables = [[tag, *entry.names] for tag, entry in writer.used.items()]
        return json.dumps([FORMAT, tables, body], separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        """The value of the document ``data``; SerialError where it is not one this schema
        reads whole."""
        return self.deferred(data)()

    def deferred(self, data: bytes) -> Callable[[], Any]:
        """The document ``data`` parsed and its class table checked now (SerialError where
        either fails), and a function that builds its value when called (SerialError where
        the value is malformed): for a part of a cache entry that a run may never need."""
        try:
            document = json.loads(data, object_pairs_hook=_no_objects)
        except (ValueError, RecursionError) as exc:  # (SerialError, UnicodeDecodeError: ValueErrors)
            raise SerialError(f"not a document: {exc}") from exc
        if type(document) is not list or len(document) != 3 or document[0] != FORMAT:
            raise SerialError("not a document of this format")
        if type(document[1]) is not list:
            raise SerialError("the class table is not a list")
        classes = {}
        for row in document[1]:
            if type(row) is not list or not row:
                raise SerialError(f"a row of the class table that is not a class: {row!r}")
            tag, *fields = row
            entry = self.resolve(tag)
            if fields != entry.names:
                raise SerialError(f"{tag} was written with the fields {fields}, and has {entry.names}")
            classes[tag] = entry
        value = document[2]

        def build() -> Any:
            try:
                return _reader(classes)(value) if type(value) is list else value
            except SerialError:
                raise
            except (TypeError, ValueError, LookupError, AttributeError, RecursionError) as exc:
                raise SerialError(f"malformed document: {exc!r}") from exc

        return build


class _Writer:
    def __init__(self, schema: Schema, substitute: Callable[[Any], Any] | None):
        self.schema = schema
        self.substitute = substitute
        self.used: dict[str, _Class] = {}
        self.index: dict[int, int] = {}  # id of an object written -> its number
        self.keep: list[Any] = []  # the objects numbered, alive while their ids are in use
        self.open: set[int] = set()  # objects being written: met again, they are a cycle

    def write(self, obj: Any) -> Any:
        kind = type(obj)
        if kind in _SCALARS:
            return obj
        number = self.index.get(id(obj))
        if number is not None:
            return ["@", number]
        if id(obj) in self.open:
            raise SerialError(f"a cycle through {kind.__qualname__}")
        self.open.add(id(obj))
        if kind is list:
            out = ["l", *map(self.write, obj)]
        elif kind is tuple:
            out = ["t", *map(self.write, obj)]
        elif kind is set or kind is frozenset:
            out = ["s" if kind is set else "f", *map(self.write, obj)]
        elif kind is dict:
            out = ["d"]
            for key, value in obj.items():
                out += (self.write(key), self.write(value))
        elif kind is bytes:
            out = ["b", binascii.b2a_base64(obj, newline=False).decode("ascii")]
        else:
            out = self._instance(obj)
        self.open.discard(id(obj))
        self.index[id(obj)] = len(self.keep)
        self.keep.append(obj)
        return out

    def _instance(self, obj: Any) -> list:
        if self.substitute is not None:
            obj = self.substitute(obj)
            if type(obj) in _SCALARS:
                raise SerialError(f"a stand-in must be an instance, not {obj!r}")
        tag = type(obj).__name__
        entry = self.schema.resolve(tag)
        if entry.cls is not type(obj):
            raise SerialError(f"{type(obj).__module__}.{type(obj).__qualname__} is not the allowed {tag}")
        self.used[tag] = entry
        return [tag, *map(self.write, entry.values(obj))]


def _no_objects(pairs: list) -> None:
    raise SerialError("a JSON object where a value belongs")


def _bytes(items: list) -> bytes:
    if len(items) != 1 or type(items[0]) is not str:
        raise SerialError("bytes that are not one base64 string")
    return binascii.a2b_base64(items[0].encode("ascii"))


def _dict(items: list) -> dict:
    if len(items) % 2:
        raise SerialError("a dict with a key and no value")
    return dict(zip(items[::2], items[1::2], strict=True))


_BUILTINS: dict[str, Callable[[list], Any]] = {
    "l": lambda items: items, "t": tuple, "s": set, "f": frozenset, "d": _dict, "b": _bytes,
}  # fmt: skip


def _reader(classes: dict[str, _Class]) -> Callable[[Any], Any]:
    """The function that reads a document's value, its classes ``classes`` (a closure: a
    warm start reads a few thousand nodes, and locals are the fastest names)."""
    done: list[Any] = []  # the objects read, numbered as the writer numbered them
    builtins = _BUILTINS

    def read(node: list) -> Any:
        tag = node[0]
        if tag == "@":
            number = node[1]
            if type(number) is not int or number < 0 or len(node) != 2:
                raise SerialError(f"a reference to no object: {node[1:]}")
            return done[number]
        items = [read(item) if type(item) is list else item for item in node[1:]]
        build = builtins.get(tag) if type(tag) is str else None
        if build is not None:
            obj = build(items)
        else:
            entry = classes.get(tag) if type(tag) is str else None
            if entry is None:
                raise SerialError(f"{tag!r} is not a class of the document's table")
            if len(items) != entry.width:
                raise SerialError(f"{tag} with {len(items)} fields, not {entry.width}")
            if entry.state:
                given = len(entry.fields)
                obj = entry.make(*items[:given])
                for name, value in zip(entry.state, items[given:], strict=True):
                    setattr(obj, name, value)
            else:
                obj = entry.make(*items)
        done.append(obj)
        return obj

    return read
