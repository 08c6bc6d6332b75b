"""``@frozen``: a frozen dataclass, cheaper to make at import.

``dataclasses.dataclass(frozen=True)`` compiles six methods from source for every class
(``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__setattr__``, ``__delattr__``: one
``exec`` of about 0.1 ms each, with the type of every field passed in), and ``simdist predict``
imports some fifty such classes: about 0.65 ms each, about 0.25 ms with ``@frozen``. It lets
dataclasses record the fields (``fields``, ``replace``, ``asdict``, ``__match_args__``, slots)
without making methods, compiles in one ``exec`` the methods whose speed counts, written as
dataclasses writes them (``__init__`` setting each field with ``object.__setattr__``, filling
defaults and factories and calling ``__post_init__``; ``__eq__`` and ``__hash__`` over the same
tuples of compared and hashed fields), and gives the others as closures over the field names
with dataclasses' behaviour: the same repr text, assignment and deletion refused with
``FrozenInstanceError``, pickling of slotted instances. Methods the class defines itself are
kept. A class with a dataclass base gets dataclasses' own ``__init__`` and frozen methods (its
frozenness is checked against the base's); ``InitVar`` and ``init=False`` fields are refused
(there are none).
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
    """``@dataclass(frozen=True, slots=..., kw_only=..., eq=...)`` made with one ``exec`` instead
    of six (see the module's docstring)."""

    def wrap(c: type[T]) -> type[T]:
        own = dict(c.__dict__)
        if "__setattr__" in own or "__delattr__" in own:
            raise TypeError(f"Cannot overwrite attribute __setattr__ or __delattr__ in class {c.__name__}")
        inherits = any(hasattr(b, "__dataclass_fields__") for b in c.__mro__[1:])
        if inherits:  # dataclasses checks the bases' frozenness: let it make the frozen methods
            made = dataclass(c, frozen=True, slots=slots, kw_only=kw_only, repr=False, eq=False)
        else:
            made = dataclass(c, slots=slots, kw_only=kw_only, init=False, repr=False, eq=False)
        fs = fields(made)
        if not inherits:
            if len(fs) != len(made.__dataclass_fields__) or not all(f.init for f in fs):  # type: ignore[attr-defined]
                raise TypeError(f"{c.__name__}: @frozen takes no InitVar, ClassVar or init=False fields")
            _method(made, "__setattr__", _setattr_of(made, frozenset(f.name for f in fs)))
            _method(made, "__delattr__", _delattr_of(made, frozenset(f.name for f in fs)))
            if slots and "__getstate__" not in own:
                _method(made, "__getstate__", _getstate)
                _method(made, "__setstate__", _setstate)
            if not own.get("__doc__"):  # worked out when read (inspect.signature is slow)
                made.__doc__ = _SignatureDoc()
        params = made.__dataclass_params__  # type: ignore[attr-defined]
        params.init = params.repr = params.frozen = True
        params.eq = eq
        if "__repr__" not in own:
            _method(made, "__repr__", _repr_of(tuple(f.name for f in fs if f.repr)))
        compared = hashed = None
        if eq and "__eq__" not in own:
            compared = [f.name for f in fs if f.compare]
        # dataclasses keeps a __hash__ the class defines, unless it is the None that defining
        # __eq__ alone sets; otherwise a frozen class with eq hashes its hashed fields
        if eq and ("__hash__" not in own or (own["__hash__"] is None and "__eq__" in own)):
            hashed = [f.name for f in fs if (f.compare if f.hash is None else f.hash)]
        for name, fn in _compiled(made, None if inherits else fs, compared, hashed).items():
            _method(made, name, fn)
        return made

    return wrap if cls is None else wrap(cls)


def _method(cls: type, name: str, fn: Callable[..., Any]) -> None:
    fn.__qualname__ = f"{cls.__qualname__}.{name}"
    setattr(cls, name, fn)


def _compiled(cls: type, init: tuple[Any, ...] | None, compared: list[str] | None,
              hashed: list[str] | None) -> dict[str, Callable[..., Any]]:
    """``__init__`` (over the fields ``init``), ``__eq__`` (of ``compared``) and ``__hash__`` (of
    ``hashed``), each left out when None, compiled from source in one ``exec``: they run as
    fast as dataclasses' own (an attribute read per field, no call per field)."""
    ns: dict[str, Any] = {"__frozen_set": object.__setattr__, "__frozen_factory": _FACTORY}
    src: list[str] = []
    if init is not None:
        src += _init_source(cls, init, ns)
    if compared is not None:
        mine, theirs = (", ".join(f"{who}.{n}" for n in compared) + ("," if compared else "")
                        for who in ("self", "other"))
        src += ["def __eq__(self, other):", "  if other.__class__ is self.__class__:",
                f"    return ({mine}) == ({theirs})", "  return NotImplemented"]
    if hashed is not None:
        mine = ", ".join(f"self.{n}" for n in hashed) + ("," if hashed else "")
        src += ["def __hash__(self):", f"  return hash(({mine}))"]
    if not src:
        return {}
    exec("\n".join(src) + "\n", ns)
    out = {name: ns[name] for name in ("__init__", "__eq__", "__hash__") if name in ns}
    if init is not None:
        out["__init__"].__annotations__ = {**{f.name: f.type for f in init}, "return": None}
    return out


def _init_source(cls: type, fs: tuple[Any, ...], ns: dict[str, Any]) -> list[str]:
    """``__init__(self, <positional fields>, *, <keyword-only fields>)``: its source lines, its
    defaults and factories put in ``ns``."""
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
    return [f"def __init__({signature}):", *(body or ["  pass"])]


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


def _repr_of(names: tuple[str, ...]) -> Callable[[Any], str]:
    def __repr__(self: Any) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{self.__class__.__qualname__}({inner})"

    return __repr__
