"""numpy's bfloat16, from ml_dtypes, imported only where a bfloat16 array is made.

numpy has no bfloat16 of its own; ml_dtypes adds one. It is an optional dependency
(the ``bf16`` and ``torch`` extras): importing it costs most of a second with some
releases, and float32, float16, the integers and every codec on float32 gradients
work without it. A caller that needs a bfloat16 numpy dtype calls `bfloat16()`, which
imports ml_dtypes on first use or raises an ImportError saying what to install.
Code that only needs to recognise a bfloat16 array calls `loaded_bfloat16()`: a
bfloat16 numpy array can exist only once ml_dtypes is imported, so it never imports.
"""

from __future__ import annotations

import sys
from typing import Optional

import numpy as np

__all__ = ["INSTALL_HINT", "bfloat16", "loaded_bfloat16"]

INSTALL_HINT = "pip install 'ringreduce[bf16]' (or pip install ml_dtypes)"


def bfloat16(what: str = "bfloat16") -> np.dtype:
    """numpy's bfloat16 dtype, importing ml_dtypes; ImportError naming the extra without it.

    ``what`` names what needed it, for the message ("x: a torch.bfloat16 tensor").
    """
    try:
        import ml_dtypes
    except ImportError as exc:
        raise ImportError(
            f"{what} needs ml_dtypes, numpy's bfloat16, which is not installed: {INSTALL_HINT}"
        ) from exc
    return np.dtype(ml_dtypes.bfloat16)


def loaded_bfloat16() -> Optional[np.dtype]:
    """numpy's bfloat16 if ml_dtypes is already imported, else None (never imports it)."""
    module = sys.modules.get("ml_dtypes")
    return None if module is None else np.dtype(module.bfloat16)
