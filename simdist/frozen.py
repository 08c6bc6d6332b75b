"""``@frozen``: a frozen dataclass, cheaper to make at import.

``dataclasses.dataclass(frozen=True)`` compiles six methods from source for every class
(``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``: one
``exec`` of about 0.1 ms each, with the type of every field passed in), and ``simdist predict``
imports some fifty such classes: about 0.65 ms each, 0.1 ms with ``@frozen``. It lets dataclasses
record the fields (``fields``, ``replace``, ``asdict``, ``__match_args__``, slots) without making
methods, compiles a bare ``__init__`` (the one method whose speed counts: it sets each field with
``object.__setattr__`` as dataclasses' does, fills defaults and factories, calls
``__post_init__``), and gives the other methods as closures over the class's field names, with
dataclasses' behaviour: the same repr text, equality of the compared fields of two instances of
one class (``NotImplemented`` otherwise), the hash of the same tuple of hashed fields, assignment
and deletion refused with ``FrozenInstanceError``, pickling of slotted instances; methods the
class defines itself are kept. A class with a dataclass base, ``InitVar`` or ``init=False``
fields is left to dataclasses' own ``__init__`` and frozen methods (there is none such so far).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, FrozenInstanceError, dataclass, fields
from typing import Any, TypeVar, overload

T = TypeVar("T")


class _Factory:
    def __repr__(self) -> str:
        return "<factory>"  # in signatures, as dataclasses shows it


_FACTORY = _Factory()  # an argument left to its field's default_factory


@overload
def frozen(cls: type[T], /) -> type[T]: ...


@overload
def frozen(*, slots: bool = ..., kw_only: bool = ..., eq: bool = ...) -> Callable[[type[T]], type[T]]: ...


def frozen(cls: type[T] | None = None, /, *, slots: bool = False, kw_only: bool = False,
           eq: bool = True) -> Any:
    """``@dataclass(frozen=True, slots=..., kw_only=..., eq=...)`` made with one small ``exec``
    instead of six (see the module's docstring)."""

    def wrap(c: type[T]) -> type[T]:
        own = dict(c.__dict__)
        if "__setattr__" in own or "__delattr__" in own:
            raise TypeError(f"Cannot overwrite attribute __setattr__ or __delattr__ in class {c.__name__}")
        if any(hasattr(b, "__dataclass_fields__") for b in c.__mro__[1:]):
            made = dataclass(c, frozen=True, slots=slots, kw_only=kw_only, repr=False, eq=False)
        else:
            made = dataclass(c, slots=slots, kw_only=kw_only, init=False, repr=False, eq=False)
            fs = fields(made)
            if len(fs) != len(made.__dataclass_fields__) or not all(f.init for f in fs):  # type: ignore[attr-defined]
                raise TypeError(f"{c.__name__}: @frozen takes no InitVar, ClassVar or init=False fields")
            _method(made, "__init__", _init_of(made, fs))
            _method(made, "__setattr__", _setattr_of(made, frozenset(f.name for f in fs)))
            _method(made, "__delattr__", _delattr_of(made, frozenset(f.name for f in fs)))
            if slots and "__getstate__" not in own:
                _method(made, "__getstate__", _getstate)
                _method(made, "__setstate__", _setstate)
            if not own.get("__doc__"):  # worked out when read (inspect.signature is slow)
                made.__doc__ = _SignatureDoc()
        params = made.__dataclass_params__  # type: ignore[attr-defined]
        params.init = params.repr = params.frozen = True
        fs = fields(made)
        if "__repr__" not in own:
            _method(made, "__repr__", _repr_of(tuple(f.name for f in fs if f.repr)))
        if not eq:
            return made
        params.eq = True
        if "__eq__" not in own:
            _method(made, "__eq__", _eq_of(_getter(tuple(f.name for f in fs if f.compare))))
        # dataclasses keeps a __hash__ the class defines, unless it is the None that defining
        # __eq__ alone sets; otherwise a frozen class with eq hashes its hashed fields
        if "__hash__" not in own or (own["__hash__"] is None and "__eq__" in own):
            hashed = tuple(f.name for f in fs if (f.compare if f.hash is None else f.hash))
            _method(made, "__hash__", _hash_of(_getter(hashed)))
        return made

    return wrap if cls is None else wrap(cls)


def _method(cls: type, name: str, fn: Callable[..., Any]) -> None:
    fn.__qualname__ = f"{cls.__qualname__}.{name}"
    setattr(cls, name, fn)


def _init_of(cls: type, fs: tuple[Any, ...]) -> Callable[..., None]:
    """``__init__(self, <positional fields>, *, <keyword-only fields>)``, compiled from source."""
    ns: dict[str, Any] = {"__frozen_set": object.__setattr__, "__frozen_factory": _FACTORY}
    args: list[str] = []
    kw: list[str] = []
    body: list[str] = []
    defaulted = None
    for i, f in enumerate(fs):
        if f.name == "self" or f.name.startswith("__frozen"):
            raise TypeError(f"{cls.__name__}: @frozen takes no field named {f.name!r}")
        arg = f.name
        if f.default_factory is not MISSING:
            ns[f"__frozen_f{i}"] = f.default_factory
            arg += "=__frozen_factory"
            body.append(f"  if {f.name} is __frozen_factory: {f.name} = __frozen_f{i}()")
        elif f.default is not MISSING:
            ns[f"__frozen_d{i}"] = f.default
            arg += f"=__frozen_d{i}"
        if f.kw_only:
            kw.append(arg)
            continue
        if arg != f.name:
            defaulted = f.name
        elif defaulted is not None:
            raise TypeError(f"non-default argument {f.name!r} follows default argument")
        args.append(arg)
    body += [f"  __frozen_set(self, {f.name!r}, {f.name})" for f in fs]
    if hasattr(cls, "__post_init__"):
        body.append("  self.__post_init__()")
    signature = ", ".join(["self", *args, *(["*", *kw] if kw else [])])
    exec(f"def __init__({signature}):\n" + "\n".join(body or ["  pass"]) + "\n", ns)
    init = ns["__init__"]
    init.__annotations__ = {**{f.name: f.type for f in fs}, "return": None}
    return init


class _SignatureDoc:
    """The docstring dataclasses gives a class without one, its name and signature, made when
    read (a class's ``__doc__`` is looked up as a descriptor)."""

    def __get__(self, obj: Any, cls: type) -> str:
        import inspect

        try:
            return cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
        except (TypeError, ValueError):
            return cls.__name__


def _setattr_of(cls: type, names: frozenset[str]) -> Callable[[Any, str, Any], None]:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    return __setattr__


def _delattr_of(cls: type, names: frozenset[str]) -> Callable[[Any, str], None]:
    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    return __delattr__


def _getstate(self: Any) -> list[Any]:
    return [getattr(self, f.name) for f in fields(self)]


def _setstate(self: Any, state: list[Any]) -> None:
    for f, value in zip(fields(self), state, strict=True):
        object.__setattr__(self, f.name, value)  # the class refuses setattr


def _getter(names: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """The tuple of ``names``' values of an instance (the tuple dataclasses compares and hashes)."""
    if len(names) > 1:
        from operator import attrgetter

        return attrgetter(*names)  # a tuple already
    if names:
        (name,) = names
        return lambda self: (getattr(self, name),)
    return lambda self: ()


def _repr_of(names: tuple[str, ...]) -> Callable[[Any], str]:
    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{self.__class__.__qualname__}({inner})"

    return __repr__


def _eq_of(key: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any, Any], Any]:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return key(self) == key(other)
        return NotImplemented

    return __eq__


def _hash_of(key: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(key(self))

    return __hash__
