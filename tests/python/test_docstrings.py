"""Every public module, class, function, method and property of the installed embstore package
and of embstore.torch has a docstring: the docstrings are the Python package's reference.

Public: a module of the package whose name does not start with "_"; in it, the classes and
functions of its __all__ (without one: those it defines under names not starting with "_");
in such a class, the attributes not starting with "_" that it or a base class of the package
defines (methods, static and class methods, properties). Dunder methods, data attributes and
what comes from outside the package (Exception, torch.nn.Module) are not checked. A dataclass's
generated docstring (its signature) does not count."""

import dataclasses
import importlib
import importlib.util
import inspect
import pkgutil
import types
import unittest

import embstore

try:
    import torch  # noqa: F401 (embstore.torch needs it)
except ImportError:  # pragma: no cover - the CI venv has torch
    torch = None

PACKAGE = "embstore"


def _documented(doc):
    return bool(doc and doc.strip())


def _generated_doc(cls):
    """The docstring dataclasses (and namedtuple) generate for a class without one."""
    if dataclasses.is_dataclass(cls):
        try:
            return cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
        except (TypeError, ValueError):
            return None
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return f"{cls.__name__}({', '.join(cls._fields)})"
    return None


def _ours(obj, package):
    module = getattr(obj, "__module__", None) or ""
    return module == package or module.startswith(package + ".")


def _public_objects(module):
    """The objects of module's __all__; without one, those of its names not starting with "_"
    that the module itself defines (not what it imports)."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return [getattr(module, n) for n in names]
    return [obj for n, obj in vars(module).items()
            if not n.startswith("_") and getattr(obj, "__module__", None) == module.__name__]


def _member_function(attr):
    """The function behind a class attribute (method, static or class method, property
    getter), or None for data."""
    if isinstance(attr, (staticmethod, classmethod)):
        return attr.__func__
    if isinstance(attr, property):
        return attr  # a property's __doc__ is its getter's (or the doc= given)
    if inspect.isfunction(attr):
        return attr
    return None


def undocumented(modules, package=PACKAGE):
    """The qualified names of the public objects of modules that lack a docstring, sorted."""
    missing = set()
    seen = set()

    def check_class(cls):
        if id(cls) in seen:
            return
        seen.add(id(cls))
        name = f"{cls.__module__}.{cls.__qualname__}"
        doc = cls.__dict__.get("__doc__")
        if not _documented(doc) or doc == _generated_doc(cls):
            missing.add(name)
        for base in cls.__mro__:
            if base is object or not _ours(base, package):
                continue
            for attr_name, attr in vars(base).items():
                if attr_name.startswith("_"):
                    continue
                if inspect.isclass(attr) and _ours(attr, package):
                    check_class(attr)
                    continue
                fn = _member_function(attr)
                if fn is None:
                    continue
                key = (id(base), attr_name)
                if key in seen:
                    continue
                seen.add(key)
                if not _documented(fn.__doc__):
                    missing.add(f"{base.__module__}.{base.__qualname__}.{attr_name}")

    for module in modules:
        if not _documented(module.__doc__):
            missing.add(module.__name__)
        for obj in _public_objects(module):
            if inspect.isclass(obj) and _ours(obj, package):
                check_class(obj)
            elif inspect.isfunction(obj) and _ours(obj, package) and id(obj) not in seen:
                seen.add(id(obj))
                if not _documented(obj.__doc__):
                    missing.add(f"{obj.__module__}.{obj.__qualname__}")
    return sorted(missing)


def public_modules():
    """embstore and each of its modules whose name does not start with "_" (embstore.torch
    included where torch is installed)."""
    modules = [embstore]
    for info in pkgutil.iter_modules(embstore.__path__):
        if info.name.startswith("_") or (info.name == "torch" and torch is None):
            continue
        # The installed package holds libembstore.so, which ctypes loads: pkgutil lists it as
        # an extension module, but it is no Python module.
        spec = importlib.util.find_spec(f"{PACKAGE}.{info.name}")
        if not info.ispkg and not (spec is not None and (spec.origin or "").endswith(".py")):
            continue
        modules.append(importlib.import_module(f"{PACKAGE}.{info.name}"))
    return modules


class DocstringTest(unittest.TestCase):
    def test_public_api_is_documented(self):
        modules = public_modules()
        names = [m.__name__ for m in modules]
        self.assertIn("embstore.store", names)
        self.assertIn("embstore.follower", names)
        missing = undocumented(modules)
        self.assertEqual(missing, [], "public objects without a docstring:\n  " +
                         "\n  ".join(missing))

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_torch_module_is_checked(self):
        self.assertIn("embstore.torch", [m.__name__ for m in public_modules()])

    def test_checker_finds_what_lacks_a_docstring(self):
        # A module of the package made up here: the check must name each undocumented kind.
        fake = types.ModuleType(f"{PACKAGE}._fake_for_test")
        source = '''
import dataclasses

class Documented:
    """Has one."""
    def method(self):
        """Has one."""
    @property
    def prop(self):
        """Has one."""
    def _private(self):
        pass

class Bare:
    def method(self):
        pass
    @property
    def prop(self):
        return 1
    @staticmethod
    def static():
        pass
    @classmethod
    def klass(cls):
        pass

class Child(Documented):
    """Has one; inherits documented members."""

@dataclasses.dataclass
class Data:
    x: int

def function():
    pass

def documented():
    """Has one."""

def _private():
    pass
'''
        exec(compile(source, fake.__name__, "exec"), fake.__dict__)
        self.assertEqual(undocumented([fake]), sorted([
            f"{fake.__name__}", f"{fake.__name__}.Bare", f"{fake.__name__}.Bare.method",
            f"{fake.__name__}.Bare.prop", f"{fake.__name__}.Bare.static",
            f"{fake.__name__}.Bare.klass", f"{fake.__name__}.Data",
            f"{fake.__name__}.function"]))


if __name__ == "__main__":
    unittest.main()
