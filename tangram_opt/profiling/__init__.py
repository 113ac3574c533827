"""Measured per-layer profiles of a model on the local device (``tangram-opt profile``).

Builds one tensor-parallel rank of each layer kind of a :class:`~tangram_opt.specs.model.ModelSpec`
from plain PyTorch modules (:mod:`~tangram_opt.profiling.blocks`), times forward and backward
(:mod:`~tangram_opt.profiling.timer`) and writes the ``tangram_opt.layer_profile`` format
(:mod:`~tangram_opt.profiling.run`) that ``CostModel(..., profiles=...)`` and the planner read.
See docs/user_guide/profiling.md.

PyTorch is the optional ``profile`` extra: this package imports without it, and
:func:`run_profile` raises :class:`TorchUnavailableError` (with the install command) when it is
missing. Importing :mod:`~tangram_opt.profiling.blocks` or :mod:`~tangram_opt.profiling.timer`
imports torch.

Layer: consumers, above the search (it writes what the cost model reads, and imports the specs and
the cost model only).
"""

from tangram_opt.profiling.run import (CLI_FLAGS, INSTALL_FIX, EntryResult, ProfileRequest, ProfileResult,
                                       TorchUnavailableError, check_output_dir, check_request, profile_filename,
                                       run_profile, write_profile)

__all__ = ["CLI_FLAGS", "INSTALL_FIX", "EntryResult", "ProfileRequest", "ProfileResult", "TorchUnavailableError",
           "check_output_dir", "check_request", "profile_filename", "run_profile", "write_profile"]
