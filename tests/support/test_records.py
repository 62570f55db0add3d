"""Records (:mod:`dialect.records`) behave as the dataclasses they stand in for: each check
declares the same class both ways and compares what they do."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from tensorwasm.support import records


@dataclasses.dataclass
class DataSpan:
    start: int
    size: int = 0
    tags: list[str] = dataclasses.field(default_factory=list)


@records.record
class Span:
    start: int
    size: int = 0
    tags: list[str] = records.field(default_factory=list)


@records.record
class OtherSpan:
    start: int
    size: int = 0
    tags: list[str] = records.field(default_factory=list)


def _pair():
    return DataSpan, Span


def test_construction_defaults_and_repr_match_a_dataclass() -> None:
    dc, rec = _pair()
    for args, kwargs in (((4,), {}), ((4, 2), {}), ((4,), {"tags": ["x"]}), ((), {"start": 1, "size": 3})):
        a, b = dc(*args, **kwargs), rec(*args, **kwargs)
        assert repr(a) == repr(b).replace("Span", "DataSpan")
        assert vars(a) == vars(b)
    assert rec(1).tags is not rec(1).tags  # a fresh default per instance
    assert rec.size == 0 and not hasattr(rec, "tags")  # class attributes as a dataclass leaves them
    assert rec.__match_args__ == ("start", "size", "tags")


@pytest.mark.parametrize(
    ("args", "kwargs"), [((), {}), ((1, 2, [], 4), {}), ((1,), {"start": 2}), ((1,), {"width": 2})]
)
def test_bad_arguments_are_type_errors_as_for_a_dataclass(args, kwargs) -> None:
    dc, rec = _pair()
    with pytest.raises(TypeError):
        dc(*args, **kwargs)
    with pytest.raises(TypeError):
        rec(*args, **kwargs)


def test_equality_hashing_and_pickling() -> None:
    _, rec = _pair()
    assert rec(1, 2) == rec(1, 2) and rec(1, 2) != rec(1, 3)
    assert rec(1) != OtherSpan(1)  # another class with the same fields
    with pytest.raises(TypeError):
        hash(rec(1))  # mutable and compared by value: unhashable, as a dataclass
    again = pickle.loads(pickle.dumps(rec(5, 6, ["a"])))
    assert again == rec(5, 6, ["a"]) and records.asdict(again) == {"start": 5, "size": 6, "tags": ["a"]}
    assert records.replace(again, size=7) == rec(5, 7, ["a"])


def test_frozen_records_hash_by_value_refuse_assignment_and_run_post_init() -> None:
    @records.record(frozen=True)
    class Options:
        relaxed: bool = False
        level: int = 2

        def __post_init__(self) -> None:
            if self.level < 0:
                raise ValueError("negative level")

    @dataclasses.dataclass(frozen=True)
    class Options2:
        relaxed: bool = False
        level: int = 2

    assert repr(Options()) == repr(Options2()).replace("Options2", "Options")
    assert hash(Options(True)) == hash(Options(True)) and {Options(), Options()} == {Options()}
    with pytest.raises(AttributeError):
        Options().level = 3
    with pytest.raises(ValueError, match="negative"):
        Options(level=-1)


def test_fields_of_a_base_record_come_first_and_order_is_checked() -> None:
    @records.record
    class Base:
        a: int
        b: int = 1

    @records.record
    class Derived(Base):
        c: int = 2

    assert (
        repr(Derived(0))
        == "test_fields_of_a_base_record_come_first_and_order_is_checked.<locals>.Derived(a=0, b=1, c=2)"
    )
    with pytest.raises(TypeError, match="non-default"):

        @records.record
        class Bad:
            a: int = 0
            b: int


def test_a_mutable_default_is_refused_and_a_class_variable_is_no_field() -> None:
    from typing import ClassVar

    with pytest.raises(ValueError, match="default_factory"):

        @records.record
        class Shared:
            items: list = []

    @records.record
    class Counted:
        count: ClassVar[int] = 0
        name: str = "x"

    assert list(Counted.__record_fields__) == ["name"] and Counted.count == 0
    assert Counted() == Counted("x")
