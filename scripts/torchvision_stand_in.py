"""A stand-in torchvision, for building timm's models where no torchvision matches the installed
torch (this CPU machine: the index's torchvision needs a newer torch). timm's models import a
few torchvision names (FrozenBatchNorm2d, transforms' InterpolationMode) that the models
themselves never use. Importing this module makes every ``torchvision`` module exist and every
name in it a dummy class; a model that really calls torchvision fails loudly at that call.

    python -c "import sys; sys.path.insert(0, 'scripts'); import torchvision_stand_in" ...

(``fake_cuda_graphs.py --torchvision-stand-in`` does this for you.)
"""
import importlib.abc
import importlib.machinery
import sys
import types


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return name  # enum members and constants: their name is enough for timm's tables

class _Dummy(metaclass=_Meta):
    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError(f"{type(self).__name__} comes from the torchvision stand-in "
                           "(scripts/torchvision_stand_in.py): this model needs the real torchvision")

class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = type(name, (_Dummy,), {})
        setattr(self, name, value)
        return value

class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None
    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module
    def exec_module(self, module):
        pass


def install() -> None:
    """Put the stand-in first on the import path (once)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
