"""One registry mechanism for every extension point (models, substitutions, strategies): an
explicit default list plus user additions, as TorchRec does it. Loads nothing by itself."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from des.errors import ConfigError

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Name -> class. ``defaults`` returns the built-in classes (called on use, so a registry of
    classes that load TensorFlow costs nothing until one is needed); ``check`` vets a user class
    before it enters (e.g. the substitution conformance check)."""

    def __init__(self, kind: str, base: type, defaults: Callable[[], list[T]],
                 check: Callable[[T], object] | None = None) -> None:
        self.kind = kind
        self.base = base
        self._defaults = defaults
        self._check = check
        self._user: dict[str, T] = {}

    def defaults(self) -> list[T]:
        return list(self._defaults())

    def register(self, cls: T, *, replace: bool = False, check: bool = True) -> T:
        """Add ``cls`` under ``cls.name`` (usable as a decorator)."""
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"{cls!r} is not a {self.base.__name__} subclass")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{cls.__name__} must set a class attribute `name`")
        if not replace and name in self.all():
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        if check and self._check is not None:
            self._check(cls)
        self._user[name] = cls
        return cls

    def unregister(self, name: str) -> None:
        self._user.pop(name, None)

    def all(self) -> dict[str, T]:
        """Name -> class for the defaults and every user addition."""
        return {**{c.name: c for c in self.defaults()}, **self._user}

    def get(self, name: str) -> T:
        classes = self.all()
        if name not in classes:
            raise ConfigError(f"unknown {self.kind} {name!r} (choose one of: {', '.join(classes)})")
        return classes[name]
