"""The on-disk cache: a leaf that knows paths, files, locks and formats, never planning or engines.

`layout` (paths, no I/O), `files` (atomic writes, checksums), `keys` (named-dict hashing),
`jobs` (the compile-job record), `entries` (Triton's entries, read without Triton), `locks`,
`manifest`, `bundle` (the format, and writing one), `bundle_import`, `staging` (an import's
scratch directory), `trust`. The recipe of a configuration's key lives above, in
`kprecompile.build.manifest_key`. Imports only `errors`.
"""

from .layout import Bucket, CacheLayout

__all__ = ["Bucket", "CacheLayout"]
