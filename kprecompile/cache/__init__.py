"""The on-disk cache: a leaf that knows paths, files, locks and formats, never planning or engines.

`layout` (paths, no I/O), `files` (atomic writes, checksums), `keys` (named-dict hashing), `jobs`
(the compile-job record), `entries` (Triton's entries, read without Triton), `locks`, `manifest`,
`bundle` (a bundle's format, and writing one), `signing` (who signed a bundle), `archive_check`
then `archive_install` (importing an archive, a packed bundle: checking all of it, then installing
it), `staging` (an import's
scratch directory), `journal` (kernels recorded while serving), `inventory`, `pruning`, `usage`,
`served`, `trust`. The recipe of a configuration's key lives above, in
`kprecompile.warmup.manifest_key`. Imports only `errors`.
"""

from .layout import Bucket, CacheLayout

__all__ = ["Bucket", "CacheLayout"]
