"""records.builder: a record made from all its field values as its class makes it, faster."""

from __future__ import annotations

import pytest

from tensorwasm.support.records import FrozenRecordError, builder, field, record


@record
class Span:
    start: int
    size: int = 0
    tags: list[str] = field(default_factory=list)


@record(frozen=True)
class Point:
    x: int
    y: int

    def __post_init__(self) -> None:
        if self.x < 0:
            raise ValueError("x < 0")


def test_a_built_record_equals_the_one_its_class_makes() -> None:
    made = builder(Span)(4, 8, ["a"])
    assert (
        type(made) is Span and made == Span(4, 8, ["a"]) and repr(made) == "Span(start=4, size=8, tags=['a'])"
    )
    assert builder(Point)(1, 2) == Point(1, 2) and hash(builder(Point)(1, 2)) == hash(Point(1, 2))


def test_a_built_record_runs_post_init_and_stays_frozen() -> None:
    with pytest.raises(ValueError, match="x < 0"):
        builder(Point)(-1, 2)
    point = builder(Point)(1, 2)
    with pytest.raises(FrozenRecordError):
        point.x = 3


def test_a_builder_takes_every_field_and_nothing_else() -> None:
    with pytest.raises(TypeError):
        builder(Span)(4)
    with pytest.raises(TypeError):
        builder(Span)(4, 8, [], "extra")


def test_a_class_with_an_init_of_its_own_is_built_by_it() -> None:
    @record
    class Own:
        a: int

    def init(self, a: int) -> None:
        self.__dict__["a"] = a * 2

    Own.__init__ = init
    assert builder(Own) is Own
