import hashlib
import json
import logging
import shutil

from kprecompile.cache.entries import compiled_files
from kprecompile.cache.files import write_atomic
from kprecompile.cache.layout import CacheLayout, default_cache_root, triton_entry_name
from kprecompile.cache.manifest import Manifest, manifest_key, read_manifest, write_manifest
from kprecompile.cache.toolchain import current_toolchain, triton_key_digest
from kprecompile.models import load_model
from kprecompile.serving import ServingParams
from kprecompile.warming import warm


def test_cache_root_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KPRECOMPILE_CACHE_DIR", str(tmp_path / "here"))
    assert default_cache_root() == tmp_path / "here"
    monkeypatch.delenv("KPRECOMPILE_CACHE_DIR")
    assert default_cache_root().name == "kprecompile"


def test_triton_entry_name_is_tritons():
    from triton.runtime.cache import _base32

    key = hashlib.sha256(b"x").hexdigest()
    assert triton_entry_name(key) == _base32(key)


def test_write_atomic_leaves_no_temporary_files(tmp_path):
    path = tmp_path / "a" / "b.json"
    write_atomic(path, b"one")
    write_atomic(path, b"two")
    assert path.read_bytes() == b"two"
    assert [p.name for p in path.parent.iterdir()] == ["b.json"]


def test_triton_key_is_remembered_by_the_stat_of_its_inputs(cache_layout):
    from triton.runtime.cache import triton_key

    digest = triton_key_digest(cache_layout)
    assert digest == hashlib.sha256(triton_key().encode()).hexdigest()
    [memo] = cache_layout.toolchain_dir.iterdir()
    # The memo, not a fresh hash, answers the next call.
    memo.write_text(json.dumps({"triton_key_text": "remembered"}))
    remembered = hashlib.sha256(b"remembered").hexdigest()
    assert triton_key_digest(cache_layout) == remembered
    assert current_toolchain(cache_layout).triton_key == remembered


def test_a_corrupt_manifest_is_ignored_with_a_warning(cache_layout, caplog):
    parts = {"schema": 1, "x": 1}
    key = manifest_key(parts)
    write_manifest(cache_layout, Manifest(key, parts, (), ()))
    assert read_manifest(cache_layout, key) == Manifest(key, parts, (), ())

    cache_layout.manifest_path(key).write_text('{"schema": 1, "key": ')
    with caplog.at_level(logging.WARNING):
        assert read_manifest(cache_layout, key) is None
    assert "ignoring unreadable manifest" in caplog.text


def test_a_manifest_whose_kernels_went_missing_is_rewarmed(cache_layout, gfx942):
    model, serving = load_model("deepseek-v2-lite"), ServingParams(max_num_seqs=3)
    first = warm(model, serving, [gfx942], cache_layout, max_workers=2)
    assert first.compiled == first.kernels > 1 and len(first.manifests) == 1

    manifest = json.loads(open(first.manifests[0]).read())
    lost = manifest["jobs"][0]["key"]
    shutil.rmtree(cache_layout.triton_entry(lost))
    assert compiled_files(cache_layout, lost) is None

    second = warm(model, serving, [gfx942], cache_layout, max_workers=2)
    assert (second.compiled, second.cached, second.failed) == (1, first.kernels - 1, 0)
    assert compiled_files(cache_layout, lost) is not None


def test_layout_paths_are_versioned(tmp_path):
    layout = CacheLayout.at(tmp_path)
    for directory in (layout.triton_dir, layout.locks_dir, layout.manifests_dir, layout.toolchain_dir):
        assert directory.parent == tmp_path and directory.name.endswith("-v1")


def test_the_toolchain_of_a_cuda_target_names_its_ptxas(cache_layout, gfx942, sm90):
    """Triton's CUDA backend hashes the ptxas version into every key: so does the manifest."""
    assert current_toolchain(cache_layout, sm90).ptxas.startswith("Cuda compilation tools, release ")
    assert current_toolchain(cache_layout, gfx942).ptxas is None
