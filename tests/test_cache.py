"""The storage layer: layout, atomic writes, the Triton-key memo, manifests, and that `cache/`
stays a leaf that knows nothing of planning, tracing, engines or serving."""

import ast
import hashlib
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from kprecompile.cache.files import atomic_file, write_atomic
from kprecompile.cache.layout import MANIFEST_SCHEMA, Bucket, CacheLayout, triton_entry_name
from kprecompile.cache.manifest import Manifest, manifest_key, read_manifest, write_manifest
from kprecompile.inputs import settings
from kprecompile.inputs.toolchain import current_toolchain, triton_key_digest

CACHE_PACKAGE = Path(__file__).parent.parent / "kprecompile" / "cache"


def test_cache_is_a_leaf():
    """cache/ imports only cache/, errors, the standard library and its storage libraries."""
    allowed_third_party = {"cryptography"}  # the signatures of bundles
    for path in CACHE_PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                module = node.module or ""
                if node.level == 1:
                    continue  # a sibling inside cache/
                assert node.level == 2 and module == "errors", f"{path.name} imports ..{module}"
            elif isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [alias.name for alias in node.names]
                for name in names:
                    top = name.partition(".")[0]
                    assert top in sys.stdlib_module_names or top in allowed_third_party, f"{path.name} imports {name}"


def test_cache_root_comes_from_the_flag_then_the_environment_then_the_platform(monkeypatch, tmp_path):
    monkeypatch.setenv("KPRECOMPILE_CACHE_DIR", str(tmp_path / "here"))
    assert settings.cache_layout().root == tmp_path / "here"
    assert settings.cache_layout(tmp_path / "flag").root == tmp_path / "flag"
    monkeypatch.delenv("KPRECOMPILE_CACHE_DIR")
    assert settings.cache_layout().root.name == "kprecompile"
    monkeypatch.setenv("KPRECOMPILE_CACHE_LAYERS", f"{tmp_path / 'a'}:{tmp_path / 'b'}:{tmp_path / 'flag'}")
    # The writable root is never also a layer.
    assert settings.cache_layout(tmp_path / "flag").layers == (tmp_path / "a", tmp_path / "b")


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


def test_a_failed_write_leaves_the_old_file_and_nothing_else(tmp_path):
    path = tmp_path / "b.json"
    write_atomic(path, b"old")
    with pytest.raises(RuntimeError), atomic_file(path) as file:
        file.write(b"half of the new")
        raise RuntimeError("crash mid-write")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["b.json"]


@pytest.fixture
def key_asked_anew(monkeypatch):
    """Each call asks for Triton's key anew (a process asks once per cache): these tests change
    the memo between calls, as another process would."""
    from kprecompile.inputs import toolchain

    class Forgetful(dict):
        def __setitem__(self, key, value) -> None:
            pass

    monkeypatch.setattr(toolchain, "_IN_THIS_PROCESS", Forgetful())


def test_triton_key_is_remembered_by_the_stat_of_its_inputs(cache_layout, key_asked_anew):
    from triton.runtime.cache import triton_key

    digest = triton_key_digest(cache_layout)
    assert digest == hashlib.sha256(triton_key().encode()).hexdigest()
    [memo] = cache_layout.toolchain_dir.iterdir()
    # The memo, not a fresh hash, answers the next call.
    import triton

    # Its Python sources' digests as they are, libtriton's (the one the memo saves hashing) another.
    libtriton = hashlib.sha256(next(Path(triton.__file__).parent.glob("_C/libtriton.*")).read_bytes()).hexdigest()
    text = triton_key().replace(libtriton, "1" * 64)
    assert text != triton_key()
    memo.write_text(json.dumps({"triton_key_text": text}))
    remembered = hashlib.sha256(text.encode()).hexdigest()
    assert triton_key_digest(cache_layout) == remembered
    assert current_toolchain(cache_layout).triton_key == remembered


def test_a_remembered_triton_key_that_is_not_one_is_computed_again_and_replaced(cache_layout, caplog, key_asked_anew):
    """A poisoned memo would make every compile's key differ from the plan's, forever."""
    from triton.runtime.cache import triton_key

    triton_key_digest(cache_layout)
    [memo] = cache_layout.toolchain_dir.iterdir()
    memo.write_text(json.dumps({"triton_key_text": "poison"}))
    with caplog.at_level(logging.WARNING):
        assert triton_key_digest(cache_layout) == hashlib.sha256(triton_key().encode()).hexdigest()
    assert "ignoring a remembered Triton key that is not this Triton's" in caplog.text
    assert json.loads(memo.read_text())["triton_key_text"] == triton_key()


def test_a_remembered_triton_key_of_plausible_digests_that_are_not_these_files_is_computed_again(
    cache_layout, caplog, key_asked_anew
):
    """The issue's memo of plausible 64-hex values: verify then said toolchain mismatch on a warm
    cache and warm wrote manifests under the wrong key. Guard: the source digests' check in
    `_is_triton_key`."""
    import triton
    from triton.runtime.cache import triton_key

    triton_key_digest(cache_layout)
    [memo] = cache_layout.toolchain_dir.iterdir()
    plausible = triton.__version__ + "-".join(hashlib.sha256(bytes([n])).hexdigest() for n in range(29))
    memo.write_text(json.dumps({"triton_key_text": plausible}))
    with caplog.at_level(logging.WARNING):
        assert triton_key_digest(cache_layout) == hashlib.sha256(triton_key().encode()).hexdigest()
    assert "ignoring a remembered Triton key that is not this Triton's" in caplog.text
    assert json.loads(memo.read_text())["triton_key_text"] == triton_key()


def test_triton_key_is_asked_once_per_process_and_cache(cache_layout, monkeypatch):
    """A server preloading 128 configurations read Triton's files once per configuration (0.45 s
    on the H200 host): the process asks once per cache."""
    from triton.runtime.cache import triton_key

    from kprecompile.inputs import toolchain

    monkeypatch.setattr(toolchain, "_IN_THIS_PROCESS", {})
    read = []
    inputs = toolchain._triton_key_inputs
    monkeypatch.setattr(toolchain, "_triton_key_inputs", lambda package: read.append(package) or inputs(package))
    for _ in range(3):
        assert toolchain.triton_key_text(cache_layout) == triton_key()
    assert len(read) == 1
    # The control: another cache is asked on its own.
    other = CacheLayout.of(cache_layout.root.parent / "other")
    assert toolchain.triton_key_text(other) == triton_key() and len(read) == 2


def test_a_handed_key_reaches_the_modules_that_bound_tritons_function_at_import():
    """Triton's autotuner and torch inductor's `triton_compat` (which vLLM's torch.compile asks)
    bind `triton_key` at their import: handed only to `triton.runtime.cache`, they would hash
    libtriton all the same. Another function of that name (inductor's `codecache.triton_key`, a
    wrapper) is left alone. In a fresh process: the handed key lasts for the process."""
    script = (
        "import torch._inductor.codecache as codecache, torch._inductor.runtime.triton_compat as compat; "
        "import triton.runtime.autotuner as autotuner, triton.runtime.cache as cache; "
        "wrapper = codecache.triton_key; "
        "from kprecompile.inputs.toolchain import give_triton_its_key; give_triton_its_key('handed'); "
        "print([cache.triton_key(), autotuner.triton_key(), compat.triton_key(), codecache.triton_key is wrapper])"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "['handed', 'handed', 'handed', True]"


# Spellings of a value as a user may set it: libtriton reports booleans in one spelling.
SPELLINGS = ("1", "0", "ON", "off", "True", "FALSE", "yes", "x y")


def test_triton_variables_from_the_memo_are_libtritons_answer(cache_layout, monkeypatch):
    """The memo knows which set variables are on libtriton's list; the values are read here, as
    libtriton spells them: equal to its own answer for every spelling, under every Triton."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    from kprecompile.inputs import triton_env

    # Variables on libtriton's list in every supported Triton, and one that is on no list.
    listed = ("TRITON_DEFAULT_FP_FUSION", "MLIR_ENABLE_DUMP", "LLVM_IR_ENABLE_DUMP")
    for name in listed:
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("KPRECOMPILE_TEST_UNLISTED", "1")
    assert set(get_cache_invalidating_env_vars()) >= set(listed)
    asked = []
    real = get_cache_invalidating_env_vars

    def asking():
        asked.append(True)
        return real()

    monkeypatch.setattr("triton._C.libtriton.get_cache_invalidating_env_vars", asking)
    assert triton_env.remembered_triton_values(cache_layout) == real() and len(asked) == 1
    for spelling in SPELLINGS:
        for name in listed:
            monkeypatch.setenv(name, spelling)
        assert triton_env.remembered_triton_values(cache_layout) == real(), spelling
    assert len(asked) == 1  # every answer above came from the memo
    # The control: a variable set that the memo has not seen is libtriton's to answer.
    monkeypatch.setenv("AMDGCN_USE_BUFFER_OPS", "0")
    assert triton_env.remembered_triton_values(cache_layout) == real() and len(asked) == 2
    monkeypatch.delenv("AMDGCN_USE_BUFFER_OPS")
    assert triton_env.remembered_triton_values(cache_layout) == real() and len(asked) == 2


def test_triton_identity_without_importing_triton_is_tritons_own(cache_layout):
    """The version and directory read from the package's files, and the memo's key, equal what
    `import triton` gives (in a fresh process, so that the answer cannot come from an import)."""
    import triton
    from triton.runtime.cache import triton_key

    triton_key_digest(cache_layout)  # the memo
    script = (
        "import sys; from kprecompile.cache.layout import CacheLayout; "
        "from kprecompile.inputs.toolchain import triton_dir, triton_key_text, triton_version; "
        f"layout = CacheLayout.of({str(cache_layout.root)!r}); "
        "print(triton_version()); print(triton_dir()); print(triton_key_text(layout)); print('triton' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    version, directory, key, imported = result.stdout.splitlines()
    assert (version, directory, key) == (triton.__version__, str(Path(triton.__file__).parent), triton_key())
    assert imported == "False"


def test_a_corrupt_manifest_is_ignored_with_a_warning(cache_layout, caplog):
    parts = {"schema": 1, "x": 1}
    key = manifest_key(parts)
    write_manifest(cache_layout, Manifest(key, parts, (), ()))
    assert read_manifest(cache_layout, key) == Manifest(key, parts, (), ())

    cache_layout.manifest_path(key).write_text('{"schema": 1, "key": ')
    with caplog.at_level(logging.WARNING):
        assert read_manifest(cache_layout, key) is None
    assert "ignoring unreadable manifest" in caplog.text


def test_a_manifest_whose_parts_do_not_hash_to_its_name_is_ignored(cache_layout, caplog):
    parts = {"schema": 1, "x": 1}
    key = manifest_key(parts)
    write_manifest(cache_layout, Manifest(key, {"schema": 1, "x": 2}, (), ()))
    with caplog.at_level(logging.WARNING):
        assert read_manifest(cache_layout, key) is None
    assert "do not hash to its key" in caplog.text


def test_every_bucket_is_versioned_and_the_manifest_schema_is_its_buckets(tmp_path):
    layout = CacheLayout.of(tmp_path)
    for bucket in Bucket:
        assert layout.bucket(bucket).parent == tmp_path and bucket.value.endswith(f"-v{bucket.version}")
    assert layout.manifests_dir.name == f"manifests-v{MANIFEST_SCHEMA}"


def test_the_toolchain_of_a_cuda_target_names_its_ptxas(cache_layout, gfx942, sm90):
    """Triton's CUDA backend hashes the ptxas version into every key: so does the manifest."""
    assert current_toolchain(cache_layout, sm90).ptxas.startswith("Cuda compilation tools, release ")
    assert current_toolchain(cache_layout, gfx942).ptxas is None


LAYER_MEMO = """
import json, sys
from kprecompile.cache.layout import CacheLayout
from kprecompile.inputs.toolchain import triton_key_text
from triton.runtime.cache import triton_key
layout = CacheLayout.of(sys.argv[1], layers=(sys.argv[2],))
text = triton_key_text(layout, remember=sys.argv[3] == "remember")
print(json.dumps({"computed": triton_key.cache_info().currsize, "equal": text == triton_key()}))
"""


@pytest.mark.parametrize(
    "layer_memo, remember, computed",
    [("this Triton's", True, 0), ("this Triton's", False, 0), (None, True, 1), ("others can write", True, 1)],
    ids=["layer-memo", "layer-memo-not-remembering", "control-no-memo", "control-others-can-write"],
)
def test_a_new_writable_cache_takes_triton_key_from_a_baked_layers_memo(tmp_path, layer_memo, remember, computed):
    """An image's first container: its writable cache is new, the baked layer beside it holds the
    memo of the same Triton (same paths, sizes, times): Triton's key comes from it, libtriton not
    hashed, and is not copied into the writable cache (which may outlive the layer). Controls: a
    layer without the memo, or whose memo others can write, leaves it to Triton (remembered then)."""
    import subprocess
    import sys

    layer = CacheLayout.of(tmp_path / "layer")
    layer.root.mkdir()
    if layer_memo is not None:
        triton_key_digest(layer)  # the bake's warm writes it
        [memo] = layer.toolchain_dir.glob("*.json")
        if layer_memo == "others can write":
            memo.chmod(0o666)
    writable = tmp_path / "writable"
    done = subprocess.run(
        [sys.executable, "-c", LAYER_MEMO, str(writable), str(layer.root), "remember" if remember else "no"],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["equal"] and result["computed"] == computed
    remembered = list(CacheLayout.of(writable).toolchain_dir.glob("*.json"))
    assert len(remembered) == (1 if computed and remember else 0)
