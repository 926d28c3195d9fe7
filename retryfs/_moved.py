"""The module names of retryfs 0.1.0 (``retryfs.policy``, ``retryfs.native_copy``...), kept.

Pickles made by 0.1.0 name them (a wrapper's settings in Ray's object store, a saved job), and
code may import them: each old name loads the module that holds its code now, with a
``DeprecationWarning`` naming it. The finder is appended to ``sys.meta_path`` by
``import retryfs`` and answers for these names only.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "install"]

#: ``{old module name: the module that holds its code now}``.
MOVED = {
    "retryfs.policy": "retryfs.core.policy",
    "retryfs.classify": "retryfs.core.classify",
    "retryfs.engine": "retryfs.core.engine",
    "retryfs.budget": "retryfs.core.budget",
    "retryfs.ratelimit": "retryfs.core.ratelimit",
    "retryfs.timeouts": "retryfs.core.timeouts",
    "retryfs.watchdog": "retryfs.core.watchdog",
    "retryfs.stats": "retryfs.core.stats",
    "retryfs.redact": "retryfs.core.redact",
    "retryfs.proof": "retryfs.core.proof",
    "retryfs.exporters": "retryfs.core.exporters",
    "retryfs.locations": "retryfs.core.locations",
    "retryfs.native": "retryfs.clients",
    "retryfs._compat": "retryfs.patches",
    "retryfs.parts": "retryfs.patches.s3fs_parts",
    "retryfs.commits": "retryfs.datapath.commits",
    "retryfs.streams": "retryfs.datapath.streams",
    "retryfs.native_copy": "retryfs.datapath.upload",
    "retryfs.native_download": "retryfs.datapath.download",
    "retryfs.local_batch": "retryfs.datapath.small_files",
    "retryfs.iopool": "retryfs.datapath.iopool",
    "retryfs.tree_verify": "retryfs.datapath.verify",
    "retryfs.placeholders": "retryfs.datapath.placeholders",
    "retryfs.fsspec_handler": "retryfs.arrow.fsspec_adapter",
    "retryfs.fsspec_files": "retryfs.fsspec.files",
    "retryfs.fsspec_inner": "retryfs.fsspec.inner",
    "retryfs.fsspec_reconcile": "retryfs.fsspec.reconcile",
    "retryfs.checksums": "retryfs.transfer.checksums",
    "retryfs.transfer_results": "retryfs.transfer.results",
    "retryfs.demo_common": "retryfs.demo.common",
    "retryfs.demo_ray": "retryfs.demo.ray",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def exec_module(self, module: ModuleType) -> None:
        warnings.warn(f"{module.__name__} is now {self.new}; the old name will be removed",
                      DeprecationWarning, stacklevel=2)
        # the import system returns what sys.modules holds under the name after this
        sys.modules[module.__name__] = importlib.import_module(self.new)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        return None if new is None else importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Answer for the old names (once per process)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
