"""CPU-only tests of the package: they need the C library but neither a
GPU nor PyTorch, and run in CI (python/run_tests.sh).

- the mirror in sdpa_jit._capi against include/sdpa_jit.h, through a C
  program compiled against the header (sizes, offsets, *_INIT values,
  enum values, version macros) and the header's text (every enumerator
  and SDPA_API function mirrored, with its parameter count);
- the package imports, and works, with `import torch` blocked;
- the library lookup order (SDPA_JIT_LIBRARY, find_library, directories);
- C errors as Python exceptions naming the field, on a runtime with an
  explicit arch=90 (no GPU needed);
- plans, compiles into a fresh cache (NVRTC, no GPU), and the cache calls.
"""
import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import sdpa_jit
from sdpa_jit import _capi
from conftest import HEADER, PYTHON_DIR, REPO

LIB = os.environ.get("SDPA_JIT_LIBRARY")
needs_lib = pytest.mark.skipif(not LIB or not os.path.exists(LIB),
                               reason="no libsdpa_jit.so: set SDPA_JIT_LIBRARY or build build/")
needs_header = pytest.mark.skipif(not os.path.exists(HEADER), reason="include/sdpa_jit.h not in this checkout")

STRUCTS = {
    _capi.Strides: "sdpa_strides",
    _capi.LseStrides: "sdpa_lse_strides",
    _capi.RuntimeOptions: "sdpa_runtime_options",
    _capi.BwdDesc: "sdpa_bwd_desc",
    _capi.BwdTensors: "sdpa_bwd_tensors",
    _capi.BwdPlanOptions: "sdpa_bwd_plan_options",
    _capi.BwdPlanInfo: "sdpa_bwd_plan_info",
    _capi.CacheEntry: "sdpa_cache_entry",
    _capi.CacheStats: "sdpa_cache_stats",
}
INITS = {  # struct -> (C type, *_INIT macro, *_VERSION macro)
    _capi.RuntimeOptions: ("sdpa_runtime_options", "SDPA_RUNTIME_OPTIONS_INIT", "SDPA_RUNTIME_OPTIONS_VERSION"),
    _capi.BwdDesc: ("sdpa_bwd_desc", "SDPA_BWD_DESC_INIT", "SDPA_BWD_DESC_VERSION"),
    _capi.BwdTensors: ("sdpa_bwd_tensors", "SDPA_BWD_TENSORS_INIT", "SDPA_BWD_TENSORS_VERSION"),
    _capi.BwdPlanOptions: ("sdpa_bwd_plan_options", "SDPA_BWD_PLAN_OPTIONS_INIT", "SDPA_BWD_PLAN_OPTIONS_VERSION"),
    _capi.BwdPlanInfo: ("sdpa_bwd_plan_info", "SDPA_BWD_PLAN_INFO_INIT", "SDPA_BWD_PLAN_INFO_VERSION"),
}
ENUMS = {
    _capi.Status: "SDPA_STATUS_",
    _capi.LogLevel: "SDPA_LOG_",
    _capi.Dtype: "SDPA_DTYPE_",
    _capi.Layout: "SDPA_LAYOUT_",
    _capi.Mask: "SDPA_MASK_",
    _capi.Source: "SDPA_SOURCE_",
    _capi.CacheAccess: "SDPA_CACHE_",
    _capi.Family: "SDPA_FAMILY_",
    _capi.DqWriter: "SDPA_DQ_",
    _capi.Switch: "SDPA_SWITCH_",
}


def _scalar_fields(cls, prefix=""):
    """(C member path, ctypes type) of every scalar member, nested structs flattened."""
    out = []
    for name, ftype in cls._fields_:
        if isinstance(ftype, type) and issubclass(ftype, ctypes.Structure):
            out += _scalar_fields(ftype, f"{prefix}{name}.")
        elif isinstance(ftype, type) and issubclass(ftype, ctypes.Array):
            continue
        else:
            out.append((prefix + name, ftype))
    return out


def _value(struct, path):
    for part in path.split("."):
        struct = getattr(struct, part)
    if isinstance(struct, ctypes._Pointer) or isinstance(struct, ctypes._CFuncPtr):
        return ctypes.cast(struct, ctypes.c_void_p).value or 0
    if struct is None or isinstance(struct, bytes):
        return 0 if not struct else -1
    return struct


def _compile_probe(tmp_path):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler to check the mirror against the header")
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include <stdint.h>', '#include "sdpa_jit.h"',
             "int main(void) {"]
    for cls, cname in STRUCTS.items():
        lines.append(f'  printf("size {cname} %zu\\n", sizeof({cname}));')
        for name, _ in cls._fields_:
            lines.append(f'  printf("field {cname}.{name} %zu %zu\\n", offsetof({cname}, {name}), '
                         f'sizeof((({cname} *)0)->{name}));')
    for cls, (cname, macro, version) in INITS.items():
        lines.append(f"  {{ {cname} s = {macro};")
        for path, ftype in _scalar_fields(cls):
            if ftype in (ctypes.c_float, ctypes.c_double):
                lines.append(f'    printf("init {cname}.{path} %.9g\\n", (double)s.{path});')
            elif ftype is ctypes.c_char_p or ftype is ctypes.c_void_p or \
                    (isinstance(ftype, type) and issubclass(ftype, (ctypes._Pointer, ctypes._CFuncPtr))):
                lines.append(f'    printf("init {cname}.{path} %lld\\n", (long long)(intptr_t)s.{path});')
            else:
                lines.append(f'    printf("init {cname}.{path} %lld\\n", (long long)s.{path});')
        lines.append(f'    printf("version {cname} %d\\n", (int){version}); }}')
    for enum_cls, prefix in ENUMS.items():
        for member in enum_cls:
            lines.append(f'  printf("enum {prefix}{member.name} %d\\n", (int){prefix}{member.name});')
    lines.append('  printf("version_string %s\\n", SDPA_JIT_VERSION_STRING);')
    lines += ["  return 0;", "}"]
    src = tmp_path / "mirror.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "mirror"
    build = subprocess.run([cc, "-std=c11", "-Wall", "-I", os.path.dirname(HEADER), str(src), "-o", str(exe)],
                           capture_output=True, text=True)
    assert build.returncode == 0, f"the mirror does not compile against the header:\n{build.stderr}"
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()


@needs_header
def test_mirror_layout_init_and_enums_match_header(tmp_path):
    out = _compile_probe(tmp_path)
    seen = set()
    by_name = {cname: cls for cls, cname in STRUCTS.items()}
    init_structs = {cname: cls.init() for cls, (cname, _, _) in INITS.items()}
    for line in out:
        kind, what, *rest = line.split(" ")
        if kind == "size":
            assert ctypes.sizeof(by_name[what]) == int(rest[0]), f"sizeof({what})"
        elif kind == "field":
            cname, name = what.split(".")
            descriptor = getattr(by_name[cname], name)
            assert (descriptor.offset, descriptor.size) == (int(rest[0]), int(rest[1])), \
                f"{what}: offset/size in C {rest}, in the mirror {(descriptor.offset, descriptor.size)}"
        elif kind == "init":
            cname, path = what.split(".", 1)
            got = _value(init_structs[cname], path)
            assert float(got) == pytest.approx(float(rest[0])), f"{what} in the *_INIT macro"
        elif kind == "version":
            cls = by_name[what]
            assert cls._version_ == int(rest[0]), f"{what}: _version_ != the header's *_VERSION"
        elif kind == "enum":
            prefix = next(p for p in ENUMS.values() if what.startswith(p))
            enum_cls = next(c for c, p in ENUMS.items() if p == prefix)
            assert int(enum_cls[what[len(prefix):]]) == int(rest[0]), what
        elif kind == "version_string":
            assert what == sdpa_jit.__version__
        seen.add(kind)
    assert seen == {"size", "field", "init", "version", "enum", "version_string"}


def _header_text():
    text = open(HEADER).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


@needs_header
def test_every_enumerator_of_the_header_is_mirrored():
    text = _header_text()
    for enum_cls, prefix in ENUMS.items():
        declared = set(re.findall(rf"\b{prefix}([A-Z0-9_]+)\s*=", text))
        assert declared, f"no {prefix}* enumerators found in the header"
        assert declared == {m.name for m in enum_cls}, f"{enum_cls.__name__} vs the header's {prefix}*"


@needs_header
def test_every_function_of_the_header_is_mirrored_with_its_arity():
    text = _header_text()
    declared = {}
    for match in re.finditer(r"SDPA_API\s+[^;(]*?\b(sdpa_\w+)\s*\(([^)]*)\)\s*;", text, flags=re.S):
        params = match.group(2).strip()
        declared[match.group(1)] = 0 if params in ("", "void") else params.count(",") + 1
    assert len(declared) >= 20, "the header's SDPA_API functions were not found"
    assert set(declared) == set(_capi.PROTOTYPES), \
        f"not mirrored: {sorted(set(declared) - set(_capi.PROTOTYPES))}; " \
        f"not in the header: {sorted(set(_capi.PROTOTYPES) - set(declared))}"
    for name, arity in declared.items():
        assert len(_capi.PROTOTYPES[name][1]) == arity, f"{name}: {arity} parameters in the header"


def test_struct_init_defaults_and_unknown_fields():
    d = sdpa_jit.BwdDesc.init(head_dim=64, q=(8, 512, 64), mask=sdpa_jit.Mask.SLIDING_WINDOW)
    assert d.version == 1 and d.window_left == -1 and d.window_right == -1
    assert (d.q.batch, d.q.seq, d.q.head) == (8, 512, 64)
    assert d.mask == 3 and d.scale == 0.0
    with pytest.raises(TypeError, match="has no field 'heads'.*heads_q"):
        sdpa_jit.BwdDesc.init(heads=4)
    t = sdpa_jit.BwdTensors.init()
    assert t.version == 1 and t.q is None


def test_version():
    assert sdpa_jit.__version__ == "0.1.0"


@needs_lib
def test_library_version_matches_package():
    assert sdpa_jit.library_version() == sdpa_jit.__version__


BLOCK_TORCH = textwrap.dedent("""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is blocked in this test")
    sys.meta_path.insert(0, Block())
""")


@needs_lib
def test_imports_and_works_without_torch():
    code = BLOCK_TORCH + textwrap.dedent("""
        import sdpa_jit
        assert "torch" not in sys.modules
        rt = sdpa_jit.Runtime(arch=90, disable_disk_cache=True)
        plan = rt.plan(dtype=sdpa_jit.Dtype.BF16, layout=sdpa_jit.Layout.BSHD, batch=2, heads_q=4,
                       heads_kv=4, seqlen_q=256, seqlen_kv=256, head_dim=128)
        print(sdpa_jit.__version__, plan.key)
        try:
            import sdpa_jit.torch
        except ImportError as e:
            print("torch-module:", e)
        assert "torch" not in sys.modules
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=PYTHON_DIR))
    assert run.returncode == 0, run.stderr
    version, key = run.stdout.splitlines()[0].split(" ")
    assert version == "0.1.0" and key.startswith("sdpa_bwd;arch=90;")
    assert {"dtype=bf16", "hd=128", "layout=bshd"} <= set(key.split(";"))
    assert "torch-module: torch is blocked" in run.stdout


def test_import_needs_no_library():
    code = "import sdpa_jit, sdpa_jit._capi as c; print(sdpa_jit.__version__, c._library is None)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=PYTHON_DIR, SDPA_JIT_LIBRARY="/nonexistent/libsdpa_jit.so"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0.1.0", "True"]


# ----------------------------------------------------------- lookup order


def test_lookup_env_comes_first(tmp_path):
    lib = tmp_path / "libsdpa_jit.so"
    lib.write_bytes(b"")
    other = tmp_path / "d"
    other.mkdir()
    (other / "libsdpa_jit.so").write_bytes(b"")
    env = {"SDPA_JIT_LIBRARY": str(lib)}
    found = _capi.library_candidates(env, find_library=lambda n: "libsdpa_jit.so.0", dirs=[str(other)])
    assert found == [("SDPA_JIT_LIBRARY", str(lib))]
    assert _capi.find_library_path(env, lambda n: None, []) == ("SDPA_JIT_LIBRARY", str(lib))


def test_lookup_find_library_then_directories(tmp_path):
    (tmp_path / "libsdpa_jit.so").write_bytes(b"")
    asked = []

    def find(name):
        asked.append(name)
        return "libsdpa_jit.so.0"

    found = _capi.library_candidates({}, find_library=find, dirs=[str(tmp_path)])
    assert asked == ["sdpa_jit"]
    assert found == [("find_library", "libsdpa_jit.so.0"), ("directory", str(tmp_path / "libsdpa_jit.so"))]
    assert _capi.find_library_path({}, lambda n: None, [str(tmp_path)]) == \
        ("directory", str(tmp_path / "libsdpa_jit.so"))


def test_lookup_failures_say_what_to_do(tmp_path):
    with pytest.raises(sdpa_jit.LibraryNotFoundError, match="SDPA_JIT_LIBRARY.*searched"):
        _capi.find_library_path({}, lambda n: None, [str(tmp_path)])
    with pytest.raises(sdpa_jit.LibraryNotFoundError, match="SDPA_JIT_LIBRARY='/nope/lib.so' does not exist"):
        _capi.find_library_path({"SDPA_JIT_LIBRARY": "/nope/lib.so"}, lambda n: "x", [])
    bogus = tmp_path / "libsdpa_jit.so"
    bogus.write_text("not a shared object")
    with pytest.raises(sdpa_jit.LibraryNotFoundError, match="could not load"):
        _capi.load_library(str(bogus))


def test_standard_dirs_include_prefix_lib():
    assert os.path.join(sys.prefix, "lib") in _capi._standard_dirs()
    assert "/usr/local/lib" in _capi._standard_dirs()


@needs_lib
def test_env_variable_picks_the_library(tmp_path):
    copy = tmp_path / "libsdpa_jit.so"
    shutil.copy(os.path.realpath(LIB), copy)
    code = "import sdpa_jit; lib = sdpa_jit.library(); print(lib.origin, lib.path, lib.version)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=PYTHON_DIR, SDPA_JIT_LIBRARY=str(copy)))
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["SDPA_JIT_LIBRARY", str(copy), "0.1.0"]


@needs_lib
def test_a_library_that_is_not_sdpa_jit_is_refused():
    libc = ctypes.util.find_library("c")
    if not libc:
        pytest.skip("no libc to load")
    with pytest.raises(sdpa_jit.LibraryNotFoundError, match="does not export sdpa_"):
        _capi.load_library(libc)


# ----------------------------------------------------- errors from C


def _desc(**fields):
    base = dict(dtype=sdpa_jit.Dtype.BF16, layout=sdpa_jit.Layout.BSHD, batch=2, heads_q=8, heads_kv=8,
                seqlen_q=512, seqlen_kv=512, head_dim=64)
    base.update(fields)
    return sdpa_jit.BwdDesc.init(**base)


@pytest.fixture(scope="module")
def runtime():
    if not LIB or not os.path.exists(LIB):
        pytest.skip("no libsdpa_jit.so")
    rt = sdpa_jit.Runtime(arch=90, disable_disk_cache=True)
    yield rt
    rt.close()


@pytest.mark.parametrize("fields, cls, field_text", [
    (dict(head_dim=100), sdpa_jit.InvalidArgumentError, "desc.head_dim = 100 is not supported"),
    (dict(head_dim=264), sdpa_jit.InvalidArgumentError,
     "desc.head_dim = 264 is not supported: supported are multiples of 8 from 8 to 256"),
    (dict(head_dim_v=36), sdpa_jit.InvalidArgumentError, "desc.head_dim_v = 36 is not supported"),
    (dict(dtype=7), sdpa_jit.InvalidArgumentError, "desc.dtype = 7"),
    (dict(heads_q=6, heads_kv=4), sdpa_jit.InvalidArgumentError, "heads_q 6 is not a multiple of heads_kv 4"),
    (dict(batch=0), sdpa_jit.InvalidArgumentError, "desc.batch = 0"),
    (dict(q=(512 * 8 * 64, 8 * 64 + 4, 64)), sdpa_jit.InvalidArgumentError, "desc.q.seq = 516 is not a multiple of 8"),
    (dict(mask=sdpa_jit.Mask.SLIDING_WINDOW, window_left=-2), sdpa_jit.InvalidArgumentError, "desc.window_left = -2"),
    (dict(mask=9), sdpa_jit.InvalidArgumentError, "desc.mask = 9"),
    (dict(head_dim_v=128), sdpa_jit.InvalidArgumentError, "head_dim_v = 128 is larger than desc.head_dim"),
    (dict(scale=float("inf")), sdpa_jit.InvalidArgumentError, "desc.scale"),
    (dict(version=7), sdpa_jit.InvalidArgumentError, "desc.version = 7"),
    (dict(arch=75), sdpa_jit.NotSupportedError, "sm_75"),
])
def test_plan_errors_name_the_field(runtime, fields, cls, field_text):
    with pytest.raises(cls) as info:
        runtime.plan(_desc(**fields))
    e = info.value
    assert field_text in e.message
    assert e.status_name == f"SDPA_STATUS_{e.status.name}"
    assert e.status == (sdpa_jit.Status.NOT_SUPPORTED if cls is sdpa_jit.NotSupportedError
                        else sdpa_jit.Status.INVALID_ARGUMENT)
    assert isinstance(e, ValueError) and isinstance(e, sdpa_jit.SdpaError)
    assert str(e).startswith(f"sdpa_bwd_plan_create: {e.status_name}: ")


def test_every_multiple_of_8_is_planned_unless_restricted(monkeypatch):
    """options.any_head_dim is ON by default; OFF (the plan's own, or
    SDPA_JIT_ANY_HEAD_DIM=0 read when the runtime is made) restricts plans
    to the measured head dims, with a message naming the restriction."""
    if not LIB or not os.path.exists(LIB):
        pytest.skip("no libsdpa_jit.so")
    monkeypatch.delenv("SDPA_JIT_ANY_HEAD_DIM", raising=False)
    with sdpa_jit.Runtime(arch=90, disable_disk_cache=True) as rt:
        for d, dv in ((8, 8), (80, 40), (248, 248), (256, 120)):
            plan = rt.plan(_desc(head_dim=d, head_dim_v=dv))
            assert f"hd={d};hdv={dv};" in plan.key
            plan.destroy()
        with pytest.raises(sdpa_jit.NotSupportedError) as info:
            rt.plan(_desc(head_dim=80), options={"any_head_dim": sdpa_jit.Switch.OFF})
        assert info.value.message.startswith("desc.head_dim = 80, head_dim_v = 80: "
                                             "options.any_head_dim = SDPA_SWITCH_OFF restricts")
    monkeypatch.setenv("SDPA_JIT_ANY_HEAD_DIM", "0")
    with sdpa_jit.Runtime(arch=90, disable_disk_cache=True) as rt:
        with pytest.raises(sdpa_jit.NotSupportedError, match="SDPA_JIT_ANY_HEAD_DIM=0"):
            rt.plan(_desc(head_dim=80))
        rt.plan(_desc(head_dim=80), options={"any_head_dim": sdpa_jit.Switch.ON}).destroy()
        rt.plan(_desc(head_dim=128, head_dim_v=64)).destroy()


def test_error_is_thread_local_and_picklable(runtime):
    import pickle
    import threading
    errors = []

    def bad(head_dim):
        try:
            runtime.plan(_desc(head_dim=head_dim))
        except sdpa_jit.SdpaError as e:
            errors.append(e.message)

    threads = [threading.Thread(target=bad, args=(hd,)) for hd in (44, 52, 60, 76)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(errors) == sorted(f"desc.head_dim = {hd} is not supported: supported are multiples of 8 "
                                    f"from 8 to 256" for hd in (44, 52, 60, 76))
    try:
        runtime.plan(_desc(head_dim=44))
    except sdpa_jit.SdpaError as e:
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is type(e) and str(again) == str(e)


def test_execute_errors_name_the_tensor(runtime):
    plan = runtime.plan(_desc())
    with pytest.raises(sdpa_jit.InvalidArgumentError, match="tensors.q is NULL"):
        plan.execute(sdpa_jit.BwdTensors.init(), 0, 0)
    t = sdpa_jit.BwdTensors.init(q=0x1000, k=0x1000, v=0x1000, o=0x1000, dout=0x1008, lse=0x2000,
                                 dq=0x3000, dk=0x3000, dv=0x3000)
    with pytest.raises(sdpa_jit.InvalidArgumentError, match="tensors.dout = 0x1008 is not 16-byte aligned"):
        plan.execute(t, 0x4000, plan.workspace_size)
    t.dout = 0x1000
    with pytest.raises(sdpa_jit.InvalidArgumentError, match="workspace_bytes = 16 is too small"):
        plan.execute(t, 0x4000, 16)
    with pytest.raises(sdpa_jit.InvalidArgumentError, match="tensors.version = 3"):
        plan.execute(sdpa_jit.BwdTensors.init(version=3), 0, 0)


def test_plan_key_and_workspace_without_gpu(runtime):
    plan = runtime.plan(_desc(mask=sdpa_jit.Mask.CAUSAL_BOTTOM_RIGHT))
    fields = plan.key.split(";")
    assert fields[:2] == ["sdpa_bwd", "arch=90"]
    assert {"dtype=bf16", "hd=64", "hdv=64", "mask=causal_br", "layout=bshd"} <= set(fields)
    assert re.fullmatch(r"[0-9a-f]{32}", plan.key_hash)
    assert plan.workspace_size > 0 and plan.workspace_size % 256 == 0
    # fp32 dQ accumulator: at least B * S * H * D * 4 bytes
    assert plan.workspace_size >= 2 * 512 * 8 * 64 * 4
    other = runtime.plan(_desc(mask=sdpa_jit.Mask.CAUSAL_BOTTOM_RIGHT, batch=3, heads_q=4, heads_kv=4))
    assert other.key == plan.key  # batch and heads are launch arguments
    assert runtime.plan(_desc(dtype=sdpa_jit.Dtype.FP16)).key != plan.key
    plan.destroy()
    plan.destroy()
    with pytest.raises(ValueError, match="destroyed"):
        plan.compile()


def test_runtime_close_destroys_its_plans():
    rt = sdpa_jit.Runtime(arch=90, disable_disk_cache=True)
    plan = rt.plan(_desc())
    rt.close()
    assert plan.handle is None
    with pytest.raises(ValueError, match="closed"):
        rt.plan(_desc())


def test_runtime_arch_and_options(runtime):
    assert runtime.arch == 90
    assert runtime.cache_path is None  # disable_disk_cache
    with pytest.raises(TypeError, match="log must be a callable"):
        sdpa_jit.Runtime(arch=90, disable_disk_cache=True, log=3)


@needs_lib
def test_log_callback_gets_the_unwritable_cache_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a directory")
    messages = []
    rt = sdpa_jit.Runtime(arch=90, cache_path=str(blocker / "kernels.sqlite"),
                          log=lambda level, text: messages.append((level, text)))
    assert rt.cache_path is None  # fell back to memory
    assert any(level == sdpa_jit.LogLevel.WARNING for level, _ in messages), messages
    rt.close()


@needs_lib
def test_configure_rejects_unknown_options():
    with pytest.raises(TypeError):
        sdpa_jit.configure(no_such_option=1)


# ---------------------------------------------- compile and the cache


@needs_lib
def test_compile_into_cache_then_disk_then_shipped(tmp_path):
    path = tmp_path / "kernels.sqlite"
    desc = _desc(head_dim=64, mask=sdpa_jit.Mask.CAUSAL_TOP_LEFT)
    with sdpa_jit.Runtime(arch=90, cache_path=str(path)) as rt:
        assert rt.cache_path == str(path)
        plan = rt.plan(desc)
        assert plan.source == sdpa_jit.Source.NONE
        assert plan.compile() == sdpa_jit.Source.COMPILED  # NVRTC, no GPU needed
        assert plan.compile() == sdpa_jit.Source.MEMORY
        rows = rt.cache_list()
        assert [r.key_text for r in rows] == [plan.key]
        row = rows[0]
        assert (row.arch, row.dtype, row.head_dim, row.mask, row.layout) == (90, "bf16", 64, "causal_tl", "bshd")
        assert row.key_hash == plan.key_hash and row.cubin_bytes > 0 and row.readonly == 0
        assert rt.cache_get(plan.key_hash[:8]).key_text == plan.key
        assert rt.cache_get(plan.key).key_hash == plan.key_hash
        cubin = rt.cache_cubin(plan.key_hash)
        assert cubin[:4] == b"\x7fELF" and len(cubin) == row.cubin_bytes
        stats = rt.cache_stats()
        assert stats.entries == 1 and stats.readonly_entries == 0 and stats.cubin_bytes == row.cubin_bytes
        assert rt.cache_verify() == (1, 0)
        with pytest.raises(sdpa_jit.NotFoundError) as info:
            rt.cache_get("0123456789abcdef")
        assert isinstance(info.value, LookupError)
    with sdpa_jit.Runtime(arch=90, cache_path=str(path)) as rt:
        assert rt.plan(desc).compile() == sdpa_jit.Source.DISK
    shipped = tmp_path / "shipped.sqlite"
    shutil.copy(path, shipped)
    with sdpa_jit.Runtime(arch=90, cache_path=str(tmp_path / "empty.sqlite"),
                          readonly_cache_paths=[str(shipped)]) as rt:
        assert rt.plan(desc).compile() == sdpa_jit.Source.SHIPPED
        assert rt.cache_stats().readonly_entries == 1
        assert [r.readonly for r in rt.cache_list()] == [1]
    with sdpa_jit.Runtime(arch=90, cache_path=str(path)) as rt:
        assert rt.cache_prune(max_bytes=0) == 1
        assert rt.cache_list() == []


@needs_lib
def test_default_runtime_reads_readonly_env(tmp_path):
    code = textwrap.dedent("""
        import sdpa_jit
        rt = sdpa_jit.default_runtime()
        assert rt is sdpa_jit.default_runtime()
        print(rt.options["readonly_cache_paths"], rt.cache_path)
    """)
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR, SDPA_JIT_CACHE=str(tmp_path / "c.sqlite"),
               SDPA_JIT_READONLY_CACHE=os.pathsep.join([str(tmp_path / "a.sqlite"), str(tmp_path / "b.sqlite")]))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"('{tmp_path}/a.sqlite', '{tmp_path}/b.sqlite') {tmp_path}/c.sqlite"


# ----------------------------------------------- plan options and info


def test_plan_options_set_the_tiles_and_info_says_what_was_chosen(runtime):
    plan = runtime.plan(_desc(), options={"q_tile": 64, "kv_tile": 64, "warps": 8, "stages": 2})
    fields = plan.key.split(";")
    assert "qt=64" in fields and "kvt=64" in fields
    info = plan.info()
    assert (info["q_tile"], info["kv_tile"], info["warps"], info["stages"]) == (64, 64, 8, 2)
    assert info["family"] in (sdpa_jit.Family.MMA, sdpa_jit.Family.HOPPER)
    assert info["family_reason"] and info["smem_bytes"] > 0
    assert f"family={info['family'].name.lower()}" in fields
    assert info["source"] == sdpa_jit.Source.NONE
    default = runtime.plan(_desc())
    assert default.key != plan.key
    with pytest.raises(TypeError, match="options must be an sdpa_jit.BwdPlanOptions"):
        runtime.plan(_desc(), options=[64, 64])
    with pytest.raises(sdpa_jit.SdpaError) as e:
        runtime.plan(_desc(), options={"q_tile": 48, "kv_tile": 64, "warps": 8, "stages": 2})
    assert "q_tile" in e.value.message or "tile" in e.value.message


@needs_lib
def test_cache_default_location_follows_the_environment(tmp_path):
    code = "import sdpa_jit; print(sdpa_jit.cache_default_location())"
    for env, expected in (({"SDPA_JIT_CACHE": str(tmp_path / "x.sqlite")}, str(tmp_path / "x.sqlite")),
                          ({"XDG_CACHE_HOME": str(tmp_path)}, str(tmp_path / "sdpa-jit" / "kernels.sqlite"))):
        clean = {k: v for k, v in os.environ.items() if k not in ("SDPA_JIT_CACHE", "XDG_CACHE_HOME")}
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(clean, PYTHONPATH=PYTHON_DIR, **env))
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == expected
    assert not (tmp_path / "sdpa-jit").exists()  # creates nothing


@needs_lib
def test_cache_required_makes_an_unusable_cache_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(sdpa_jit.CacheError):
        sdpa_jit.Runtime(arch=90, cache_path=str(blocker / "kernels.sqlite"), cache_required=True,
                         log=lambda level, text: None)


@needs_lib
def test_read_only_access_stores_nothing(tmp_path):
    path = tmp_path / "kernels.sqlite"
    desc = _desc(head_dim=128)
    with sdpa_jit.Runtime(arch=90, cache_path=str(path)) as rt:
        assert rt.plan(desc).compile() == sdpa_jit.Source.COMPILED
    size = path.stat().st_size
    with sdpa_jit.Runtime(arch=90, cache_path=str(path), cache_access=sdpa_jit.CacheAccess.READ_ONLY) as rt:
        assert rt.plan(desc).compile() == sdpa_jit.Source.DISK
        other = rt.plan(_desc(head_dim=128, dtype=sdpa_jit.Dtype.FP16))
        assert other.compile() == sdpa_jit.Source.COMPILED
        assert other.info()["stored"] == 0
        assert len(rt.cache_list()) == 1
    with sdpa_jit.Runtime(arch=90, cache_path=str(path)) as rt:
        assert [r.key_text for r in rt.cache_list()] == [rt.plan(desc).key]
    assert path.stat().st_size == size


@needs_lib
def test_cache_verify_reports_a_damaged_row(tmp_path):
    import sqlite3
    path = tmp_path / "kernels.sqlite"
    with sdpa_jit.Runtime(arch=90, cache_path=str(path)) as rt:
        plan = rt.plan(_desc(head_dim=64))
        plan.compile()
        assert rt.cache_verify(report=lambda *a: None) == (1, 0)
    db = sqlite3.connect(path)
    columns = [r[1] for r in db.execute("pragma table_info(kernels)")]
    blob = next(c for c in columns if c in ("cubin", "blob", "data"))
    db.execute(f"update kernels set {blob} = zeroblob(length({blob}))")
    db.commit()
    db.close()
    problems = []
    with sdpa_jit.Runtime(arch=90, cache_path=str(path)) as rt:
        checked, removed = rt.cache_verify(report=lambda *args: problems.append(args))
    assert (checked, removed) == (1, 1)
    assert len(problems) == 1
    key_hash, key_text, problem, was_removed = problems[0]
    assert key_hash == plan.key_hash and key_text == plan.key and problem and was_removed is True
