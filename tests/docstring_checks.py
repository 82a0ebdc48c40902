"""The docstring rule for public API: a docstring with an example, and full type hints."""

import dataclasses
import inspect
from types import ModuleType
from typing import List


def _from_outside(cls: type, name: str) -> bool:
    """Whether ``name`` overrides a method of a base class from another package (a framework's hook)."""
    return any(name in vars(base) and not base.__module__.startswith("bcrecord") for base in cls.__mro__[1:])


def undocumented(module: ModuleType) -> List[str]:
    """Public functions and methods of ``module`` that break the rule, with what they lack."""
    found = []
    for name, obj in vars(module).items():
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        items = [(name, obj, False)]
        # A Protocol's methods are the interface others implement: its class docstring shows it.
        # Properties are attributes, shown in their class's example, not functions to call.
        if inspect.isclass(obj) and not getattr(obj, "_is_protocol", False):
            # A dataclass field whose default is a function is a value, not a method.
            fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
            for attr, value in vars(obj).items():
                if attr.startswith("_") or attr in fields or _from_outside(obj, attr):
                    continue
                if isinstance(value, (staticmethod, classmethod)):
                    items.append((f"{name}.{attr}", value.__func__, isinstance(value, classmethod)))
                elif inspect.isfunction(value):
                    items.append((f"{name}.{attr}", value, True))
        for where, function, bound in items:
            if not inspect.isfunction(function):
                continue
            lacks = []
            if ">>>" not in (function.__doc__ or ""):
                lacks.append("an example")
            signature = inspect.signature(function)
            if signature.return_annotation is inspect.Signature.empty:
                lacks.append("a return type")
            lacks += [
                f"a type for {p.name}"
                for p in list(signature.parameters.values())[1 if bound else 0 :]  # not self, cls
                if p.annotation is inspect.Parameter.empty
            ]
            if lacks:
                found.append(f"{module.__name__}.{where}: {', '.join(lacks)}")
    return found
