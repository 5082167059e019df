"""Compression for the collectives: codecs (what travels), error feedback (what they
drop, kept for the next call), the auto policy (when compressing pays) and the quality
canary (how much error they inject). The collective that uses them is
``ringreduce._comm.compressed``; the page is docs/compression.md.

    comm.all_reduce(x, compression="int8", error_feedback=ef.key("layer1.weight"))
"""

from __future__ import annotations

from .canary import CompressionWarning
from .codecs import (
    ALGEBRAS,
    BLOCK,
    BFloat16Codec,
    BlockIntCodec,
    Codec,
    Float16Codec,
    codec_names,
    get_codec,
    register_codec,
)
from .feedback import ErrorFeedback
from .policy import Settings, configure, settings

__all__ = [
    "ALGEBRAS",
    "BLOCK",
    "BFloat16Codec",
    "BlockIntCodec",
    "Codec",
    "CompressionWarning",
    "ErrorFeedback",
    "Float16Codec",
    "Settings",
    "codec_names",
    "configure",
    "get_codec",
    "register_codec",
    "settings",
]
