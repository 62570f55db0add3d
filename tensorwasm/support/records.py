"""Records: classes declared by their annotated fields, as :func:`dataclasses.dataclass`
declares them, for the declarations a warm start of ``tensorwasm run`` loads (the loop
plans it unpickles, its loop statistics, its target).

Defining a dataclass imports :mod:`dataclasses` and :mod:`inspect` (~4.5 ms) and compiles
source for each class's methods (~0.2 ms a class): a warm start defines about twenty. A
record's ``__init__``, ``__repr__``, ``__eq__`` and ``__hash__`` are the same few
functions for every class, reading the class's field list, so a class costs microseconds.
They behave as a dataclass's do: fields in declaration order, base records' first;
defaults and ``field(default_factory=...)``; ``__post_init__``; the repr
``Name(a=1, b='x')``; equality by class and fields; ``frozen=True`` forbids assignment and
hashes by the fields, and a record that is not frozen is unhashable. Instances keep their
fields in ``__dict__``, so they pickle as dataclass instances do.

    @record
    class Span:
        start: int
        size: int = 0
        tags: list[str] = field(default_factory=list)

    Span(4)  # Span(start=4, size=0, tags=[])
"""

from __future__ import annotations

from typing import Any

_MISSING = object()


class FrozenRecordError(AttributeError):
    """An assignment to a field of a frozen record."""


class Field:
    """A field's default, where it needs more than a plain value (see :func:`field`)."""

    __slots__ = ("default", "default_factory")

    def __init__(self, default: Any, default_factory: Any) -> None:
        self.default = default
        self.default_factory = default_factory


def field(*, default: Any = _MISSING, default_factory: Any = _MISSING) -> Any:
    """A field's default value, or a function that makes one for each instance."""
    if default is not _MISSING and default_factory is not _MISSING:
        raise ValueError("a field takes a default or a default_factory, not both")
    return Field(default, default_factory)


def record(cls: type | None = None, /, *, frozen: bool = False) -> Any:
    """Make ``cls`` a record (see the module's docstring); ``@record`` or ``@record(frozen=True)``."""

    def wrap(cls: type) -> type:
        return _make(cls, frozen)

    return wrap if cls is None else wrap(cls)


def _make(cls: type, frozen: bool) -> type:
    # name -> (default or _MISSING, default_factory or _MISSING), in declaration order
    fields: dict[str, tuple[Any, Any]] = {}
    for base in reversed(cls.__mro__[1:]):
        fields.update(getattr(base, "__record_fields__", {}))
    # Not inspect.get_annotations: importing inspect is what this module spares a start.
    for name, annotation in vars(cls).get("__annotations__", {}).items():
        if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
            continue  # a class attribute, as dataclasses take it
        value = cls.__dict__.get(name, _MISSING)
        if isinstance(value, (list, dict, set)):
            raise ValueError(
                f"{cls.__name__}.{name}: a mutable default ({type(value).__name__}) would be shared "
                "by every instance; use field(default_factory=...)"
            )
        if isinstance(value, Field):
            fields[name] = (value.default, value.default_factory)
            if value.default is _MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, value.default)
        else:
            fields[name] = (value, _MISSING)
    seen_default = None
    for name, (default, factory) in fields.items():
        if default is _MISSING and factory is _MISSING:
            if seen_default is not None:
                raise TypeError(
                    f"{cls.__name__}: non-default field {name!r} follows default field {seen_default!r}"
                )
        else:
            seen_default = name
    cls.__record_fields__ = fields
    cls.__match_args__ = tuple(fields)
    cls.__init__ = _init
    cls.__repr__ = _repr
    cls.__eq__ = _eq
    if frozen:
        cls.__setattr__ = _frozen_setattr
        cls.__delattr__ = _frozen_delattr
        cls.__hash__ = _hash
    elif "__hash__" not in cls.__dict__:
        cls.__hash__ = None
    return cls


def _init(self, *args: Any, **kwargs: Any) -> None:
    fields = type(self).__record_fields__
    if not kwargs and len(args) == len(fields):  # every field given in order: no default to look up
        self.__dict__.update(zip(fields, args))
        post_init = getattr(self, "__post_init__", None)
        if post_init is not None:
            post_init()
        return
    if len(args) > len(fields):
        raise TypeError(f"{type(self).__name__}() takes {len(fields)} arguments, got {len(args)}")
    values = dict(zip(fields, args, strict=False))
    for name, value in kwargs.items():
        if name not in fields:
            raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument {name!r}")
        if name in values:
            raise TypeError(f"{type(self).__name__}() got multiple values for argument {name!r}")
        values[name] = value
    state = self.__dict__
    for name, (default, factory) in fields.items():
        if name in values:
            state[name] = values[name]
        elif default is not _MISSING:
            state[name] = default
        elif factory is not _MISSING:
            state[name] = factory()
        else:
            raise TypeError(f"{type(self).__name__}() missing required argument {name!r}")
    post_init = getattr(self, "__post_init__", None)
    if post_init is not None:
        post_init()


def _values(self) -> tuple:
    state = self.__dict__
    return tuple(state[name] for name in type(self).__record_fields__)


def _repr(self) -> str:
    state = self.__dict__
    inner = ", ".join(f"{name}={state[name]!r}" for name in type(self).__record_fields__)
    return f"{type(self).__qualname__}({inner})"


def _eq(self, other: object) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self) -> int:
    return hash(_values(self))


def _frozen_setattr(self, name: str, value: Any) -> None:
    raise FrozenRecordError(f"cannot assign to field {name!r}")


def _frozen_delattr(self, name: str) -> None:
    raise FrozenRecordError(f"cannot delete field {name!r}")


def replace(obj: Any, /, **changes: Any) -> Any:
    """A copy of the record ``obj`` with ``changes`` to its fields (as :func:`dataclasses.replace`)."""
    return type(obj)(**(asdict(obj) | changes))


def asdict(obj: Any) -> dict[str, Any]:
    """The fields of the record ``obj``, by name (a shallow copy: nested records stay records)."""
    state = obj.__dict__
    return {name: state[name] for name in type(obj).__record_fields__}


def builder(cls: type) -> Any:
    """A function that makes a record of ``cls`` from all its field values, in declaration
    order, as ``cls(*values)`` does (``__post_init__`` included) at a fraction of the cost:
    for readers that make thousands (:mod:`tensorwasm.support.serial`). A class whose
    ``__init__`` is its own is made by calling it."""
    if cls.__init__ is not _init:
        return cls
    names = tuple(cls.__record_fields__)
    width = len(names)
    post_init = getattr(cls, "__post_init__", None)
    new = object.__new__

    def build(*values: Any) -> Any:
        if len(values) != width:
            raise TypeError(f"{cls.__name__}() takes {width} values, got {len(values)}")
        obj = new(cls)
        obj.__dict__.update(zip(names, values))
        if post_init is not None:
            obj.__post_init__()
        return obj

    return build
