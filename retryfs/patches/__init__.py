"""Every change retryfs makes to another library's behaviour: the registry (versions, opt-out,
logging) in `retryfs.patches.registry`, one module per patch beside it.
"""

from .registry import (
    ENV,
    PATCHES,
    Patch,
    applies,
    disable,
    enable,
    enabled,
    install_copy_files_guard,
    note_applied,
    status,
    version_fits,
)

__all__ = ["ENV", "PATCHES", "Patch", "applies", "disable", "enable", "enabled",
           "install_copy_files_guard", "note_applied", "status", "version_fits"]
