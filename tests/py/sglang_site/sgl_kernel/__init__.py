"""A STAND-IN for SGLang's kernel package, sgl_kernel, for tests/py/test_sglang.py only.

SGLang's CPU backend imports sgl_kernel's CPU operators, and only CUDA builds of sgl_kernel are on PyPI
(`pip install sgl_kernel` gives one that fails to import without libnvrtc). This module only lets SGLang
import on a CPU without those kernels: every name it is asked for (sgl_kernel.X, sgl_kernel.sub.X, any
submodule) is a function that raises when called and is false as a value. So SGLang finds no AMX
support (cpu_has_amx_support() is false) and runs its own native torch paths: its loaders
(srt/model_loader/loader.py), its weight loaders and post-load steps, and its torch_native forward are
SGLang's real code. Nothing here computes anything.

Two torch operators are registered too (OPS: torch.ops.sgl_kernel.X, which SGLang's Gated DeltaNet backend for
Qwen3-Next looks up when its module is imported on a CPU: srt/layers/attention/linear/gdn_backend.py and
kernels/gdn_triton.py), each raising when called, so that SGLang can build that model and load it; its forward
needs them (no native torch path) and is not run. Only these names: SGLang asks hasattr(torch.ops.sgl_kernel, X)
to find kernels elsewhere (cpu_has_amx_support), and any other name stays missing.
"""
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+tpfs-stand-in"


class _Missing:
    """A name sgl_kernel would hold: raises when called, false as a value."""

    def __init__(self, name):
        self._name = name

    def __call__(self, *a, **k):
        raise RuntimeError("sgl_kernel stand-in (tests/py/sglang_site): %s is not available" % self._name)

    def __getattr__(self, n):
        if n.startswith("__"):
            raise AttributeError(n)
        return _Missing(self._name + "." + n)

    def __bool__(self):
        return False


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing("sgl_kernel." + name)


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(self.__name__ + "." + name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every sgl_kernel.* submodule a _Module."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Module(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())

OPS = ("fused_sigmoid_gating_delta_rule_update_cpu", "fused_gdn_gating_cpu")


def _register_ops():
    import torch
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for op in OPS:
        lib.define(op + "(Tensor[] args) -> Tensor")

        def missing(args, _op=op):
            raise RuntimeError("sgl_kernel stand-in (tests/py/sglang_site): torch.ops.sgl_kernel.%s is not available" % _op)
        lib.impl(op, missing, "CompositeExplicitAutograd")
    _LIBS.append(lib)  # kept alive: a Library object's operators go with it


_LIBS = []
_register_ops()
