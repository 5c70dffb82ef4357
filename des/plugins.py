"""Import user modules that register substitutions, models and data transforms (``--plugins a.py,pkg.mod``;
``des.data prepare --plugins``: ``des.data.register_transform``)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from des.errors import ConfigError


def load_plugins(spec: str) -> list[str]:
    """Import each comma-separated module name or ``.py`` path; returns the module names."""
    names = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        try:
            if item.endswith(".py"):
                path = Path(item).resolve()
                if not path.is_file():
                    raise ConfigError(f"--plugins: {item} does not exist")
                name = f"des_plugin_{path.stem}"
                if name not in sys.modules:
                    module_spec = importlib.util.spec_from_file_location(name, path)
                    module = importlib.util.module_from_spec(module_spec)
                    sys.modules[name] = module
                    module_spec.loader.exec_module(module)
            else:
                name = item
                importlib.import_module(item)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - any import failure is the user's plugin
            sys.modules.pop(f"des_plugin_{Path(item).stem}", None)
            raise ConfigError(f"--plugins: cannot import {item}: {type(exc).__name__}: {exc}") from None
        names.append(name)
    return names
