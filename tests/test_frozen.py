"""``simdist.frozen.frozen`` behaves as ``dataclass(frozen=True)``: the same constructor, repr,
equality, hash, immutability, pickling and copying, and the same dataclass metadata."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import FrozenInstanceError, field

import pytest

from simdist.frozen import frozen


def _pair(**options):
    """One class body made twice: with ``@frozen(**options)`` and ``@dataclass(frozen=True, **options)``."""

    def body():
        class Rec:
            """A record."""

            name: str
            size: int = 3
            tags: tuple[str, ...] = field(default_factory=tuple)
            note: str = field(default="", compare=False)
            secret: float = field(default=0.5, repr=False)
            unhashed: int = field(default=0, hash=False)
            later: int = field(default=7, kw_only=True)

            def __post_init__(self) -> None:
                if self.size < 0:
                    raise ValueError("size")

            def double(self) -> int:
                return 2 * self.size

        return Rec

    return frozen(**options)(body()), dataclasses.dataclass(frozen=True, **options)(body())


# module level, so that pickle finds them by name
Slotted = frozen(slots=True)(type("Slotted", (), {"__annotations__": {"a": "int", "b": "str"}, "b": "x",
                                                   "__module__": __name__, "__qualname__": "Slotted"}))
Plain = frozen(type("Plain", (), {"__annotations__": {"a": "int", "b": "str"}, "b": "x",
                                  "__module__": __name__, "__qualname__": "Plain"}))


@pytest.mark.parametrize("options", [{}, {"slots": True}, {"kw_only": True}])
def test_same_behaviour_as_dataclass(options: dict) -> None:
    ours, theirs = _pair(**options)
    kw = {"name": "a", "size": 4, "tags": ("t",), "note": "n", "secret": 1.5, "unhashed": 9, "later": 1}
    x, y = ours(**kw), theirs(**kw)
    assert repr(x) == repr(y).replace(theirs.__qualname__, ours.__qualname__)
    assert "secret" not in repr(x) and "note='n'" in repr(x)
    assert x == ours(**{**kw, "note": "other"})  # compare=False
    assert x != ours(**{**kw, "size": 5})
    assert hash(x) == hash(y)  # the same tuple of hashed fields
    assert hash(x) == hash(ours(**{**kw, "unhashed": 1}))  # hash=False
    assert x.__eq__(y) is NotImplemented and x != object()
    assert ours(name="b").tags == () and ours(name="b").tags is not None
    assert x.double() == 8 and ours.__match_args__ == theirs.__match_args__
    with pytest.raises(ValueError):
        ours(name="a", size=-1)  # __post_init__ runs
    with pytest.raises(FrozenInstanceError):
        x.size = 2
    with pytest.raises(FrozenInstanceError):
        del x.size
    assert [f.name for f in dataclasses.fields(x)] == [f.name for f in dataclasses.fields(y)]
    assert dataclasses.asdict(x) == dataclasses.asdict(y)
    assert dataclasses.replace(x, size=6) == ours(**{**kw, "size": 6})
    assert copy.deepcopy(x) == x and copy.copy(x) == x
    params = ours.__dataclass_params__
    assert params.frozen and params.eq and params.init and params.repr
    assert ("__slots__" in ours.__dict__) == bool(options.get("slots"))
    assert str(__import__("inspect").signature(ours)) == str(__import__("inspect").signature(theirs))


def test_constructor_arguments_as_dataclass() -> None:
    ours, theirs = _pair(kw_only=True)
    for cls in (ours, theirs):
        with pytest.raises(TypeError):
            cls("a")  # keyword-only
    ours, theirs = _pair()
    assert ours("a", 2) == ours(name="a", size=2)
    for cls in (ours, theirs):
        with pytest.raises(TypeError):
            cls("a", 2, (), "", 0.5, 0, 7)  # later is keyword-only
        with pytest.raises(TypeError):
            cls()  # name has no default
    with pytest.raises(TypeError, match="non-default argument"):
        frozen(type("Bad", (), {"__annotations__": {"a": "int", "b": "int"}, "a": 1}))


@pytest.mark.parametrize("cls", [Slotted, Plain])
def test_pickle_round_trip(cls: type) -> None:
    x = cls(1, "y")
    back = pickle.loads(pickle.dumps(x))
    assert back == x and back.b == "y" and hash(back) == hash(x)


def test_own_methods_kept_and_subclass() -> None:
    class Own:
        a: int

        def __repr__(self) -> str:
            return "own"

        def __eq__(self, other: object) -> bool:
            return True

    made = frozen(Own)
    assert repr(made(1)) == "own" and made(1) == made(2)
    assert hash(made(1)) == hash(made(1)) and hash(made(1)) == hash((1,))  # __eq__ alone: hashed anyway

    base = frozen(type("Base", (), {"__annotations__": {"a": "int"}}))
    sub = frozen(type("Sub", (base,), {"__annotations__": {"b": "int"}, "b": 2}))
    s = sub(1)
    assert (s.a, s.b) == (1, 2) and s == sub(1) and s != sub(1, 3) and repr(s) == "Sub(a=1, b=2)"
    with pytest.raises(FrozenInstanceError):
        s.a = 3
    undocumented = frozen(type("Bare", (), {"__annotations__": {"a": "int", "b": "str"}, "b": "x"}))
    assert undocumented.__doc__ == "Bare(a: 'int', b: 'str' = 'x')" == undocumented(1).__doc__
    identity = frozen(eq=False)(type("Id", (), {"__annotations__": {"a": "int"}}))
    assert identity(1) != identity(1)


def test_frozen_classes_outside_the_engine_use_frozen() -> None:
    """Every frozen dataclass of simdist is made with ``@frozen`` (cheaper at import), except in
    simdist/sim, whose classes are kept by its own work."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "simdist"
    offenders = [str(p.relative_to(root.parent)) for p in sorted(root.rglob("*.py"))
                 if p.relative_to(root).parts[0] != "sim" and p.name != "frozen.py"
                 and "dataclass(frozen=True" in p.read_text(encoding="utf-8")]
    assert not offenders, offenders


def test_fields_named_like_the_methods_arguments_or_builtins() -> None:
    rec = frozen(type("Rec", (), {"__annotations__": {"other": "int", "hash": "int", "object": "int"}}))
    assert rec(1, 2, 3) == rec(1, 2, 3) != rec(1, 2, 4)
    assert hash(rec(1, 2, 3)) == hash((1, 2, 3)) and repr(rec(1, 2, 3)) == "Rec(other=1, hash=2, object=3)"
