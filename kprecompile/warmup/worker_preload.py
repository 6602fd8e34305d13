"""Imported once by the compile workers' fork server (`worker_start.py`): what every worker
needs before its first job, paid once and inherited by each fork."""

import logging

try:
    import torch  # noqa: F401  (every kernel library imports it)
    from triton.runtime.cache import triton_key

    from . import compile  # noqa: F401  (kprecompile's compile path and its family registry)

    triton_key()  # Triton's toolchain hash: a walk over its own files, cached per process
except Exception as error:  # the server must start: a job that needs what failed fails on its own
    logging.getLogger(__name__).debug("fork server preload failed: %s", error)
