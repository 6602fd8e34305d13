"""Turning a request into a warm cache: `planning` (trace every family), `compile` and `pool` (compile
each unique job once, locked), `warming` (plan, replay, compile, write the manifest last),
`verification`, `manifest_key` (the key recipe), `replay` and `recorded` (kernels recorded while
serving), `bundling` (bake, export, import), `preload` (load a manifest's kernels into a process),
`doctor`. Imports `selection` and below.
"""
