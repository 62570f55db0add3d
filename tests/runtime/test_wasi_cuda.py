"""Tests of the wasi:cuda guest API (runtime/wasi_cuda.py, docs/wasi-cuda.md).

Guests call the API through a thin module that re-exports every import (:func:`shim_wat`),
so each test drives it exactly as a guest does. Without a GPU: the imports link with the
documented signatures, every GPU call answers NO_GPU, and pointer and value checks refuse
bad input first. A stand-in driver over host memory (:class:`FakeGPU`) then runs the whole
API, the example guests included, on any machine: handles, copies, argument records,
launch limits, the memory cap and faults. The tests marked ``gpu`` do the same on a device.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import wasmtime
from cuda.bindings import driver as cu

from tensorwasm.compiler.target import ARCHES, find_ptxas
from tensorwasm.runtime import driver
from tensorwasm.runtime.driver import Context, DeviceInfo
from tensorwasm.runtime.wasi_cuda import (
    ARG_RECORD,
    IMPORT_MODULE,
    IMPORTS,
    IMPORTS_BY_NAME,
    MAX_ARGS,
    ArgTag,
    HostImport,
    Status,
    WasiCuda,
    define_if_imported,
)
from tensorwasm.support.errors import TensorWasmError
from tests.conftest import ROOT

R = cu.CUresult
CUDA = ROOT / "examples/cuda"
VADD_WAT = CUDA / "vadd.wat"
VADD_C = CUDA / "vadd.c"
VADD_WASM = CUDA / "vadd.wasm"
HEADER = CUDA / "wasi_cuda.h"
DOC = ROOT / "docs/wasi-cuda.md"

# Kernels the tests need besides vadd: one that stores its pointer argument's value (so a
# guest can learn a device address and try to pass it back), and one that traps.
TEST_PTX = """
.version 7.0
.target sm_75
.address_size 64

.visible .entry address_of(
    .param .u64 address_of_out
)
{
    .reg .b64 %rd<3>;

    ld.param.u64 %rd1, [address_of_out];
    cvta.to.global.u64 %rd2, %rd1;
    st.global.u64 [%rd2], %rd1;
    ret;
}

.visible .entry trap_now()
{
    trap;
}
"""

# Guest memory layout of the shim: scratch areas at fixed offsets in its 4 pages.
PTX_AT = 0x1000
NAME_AT = 0x100
ARGS_AT = 0x200
DATA_AT = 0x10000
MEMORY_BYTES = 4 * 65536


def i32(value: int) -> int:
    """An unsigned 32-bit value as the signed i32 that wasmtime-py passes."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def shim_wat(memory: bool = True) -> str:
    """A module that imports every wasi:cuda function and exports it under the same name."""
    lines = ["(module"]
    for spec in IMPORTS:
        params = " ".join(ty for _, ty in spec.params)
        lines.append(
            f'  (import "{IMPORT_MODULE}" "{spec.name}" (func ${spec.name} (param {params}) (result i32)))'
        )
    if memory:
        lines.append(f'  (memory (export "memory") {MEMORY_BYTES // 65536})')
    for spec in IMPORTS:
        params = " ".join(ty for _, ty in spec.params)
        args = " ".join(f"(local.get {i})" for i in range(len(spec.params)))
        lines.append(
            f'  (func (export "{spec.name}") (param {params}) (result i32) (call ${spec.name} {args}))'
        )
    lines.append(")")
    return "\n".join(lines)


class Guest:
    """An instance of the shim (or of another guest) with its own :class:`WasiCuda`."""

    def __init__(self, api: WasiCuda, wat: str | None = None, memory: bool = True) -> None:
        self.api = api
        engine = wasmtime.Engine()
        self.store = wasmtime.Store(engine)
        linker = wasmtime.Linker(engine)
        api.define(linker, self.store)
        module = wasmtime.Module(engine, wasmtime.wat2wasm(wat or shim_wat(memory)))
        self.exports = linker.instantiate(self.store, module).exports(self.store)

    def __call__(self, name: str, *args: int) -> int:
        return self.exports[name](self.store, *args)

    def write(self, at: int, data: bytes) -> None:
        self.exports["memory"].write(self.store, data, at)

    def read(self, at: int, length: int) -> bytes:
        return bytes(self.exports["memory"].read(self.store, at, at + length))

    def load(self, ptx: str) -> int:
        data = ptx.encode()
        self.write(PTX_AT, data)
        return self("module_load", PTX_AT, len(data))

    def function(self, module: int, name: str) -> int:
        self.write(NAME_AT, name.encode())
        return self("module_get_function", module, NAME_AT, len(name))

    def launch(
        self,
        function: int,
        args: list[tuple[int, int, int]],
        grid: tuple[int, int, int] = (1, 1, 1),
        block: tuple[int, int, int] = (1, 1, 1),
        shared: int = 0,
    ) -> int:
        """Launch with ``args`` as (tag, handle, payload) records."""
        self.write(ARGS_AT, b"".join(ARG_RECORD.pack(*record) for record in args))
        return self("launch", function, *grid, *block, shared, ARGS_AT, len(args))

    def error(self) -> str:
        length = self("last_error", 0, 0)
        assert length >= 0
        assert self("last_error", DATA_AT, length) == length
        return self.read(DATA_AT, length).decode()


def buffer_arg(handle: int, offset: int = 0) -> tuple[int, int, int]:
    return (ArgTag.BUFFER, handle, offset)


def vadd_ptx() -> str:
    """The PTX in vadd.wat's data segment at 0x400."""
    text = VADD_WAT.read_text()
    segment = text[text.index("(data (i32.const 0x400)") : text.index('"\\00")')]
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', segment)
    return "".join(parts).replace("\\n", "\n")


def c_vadd_ptx() -> str:
    """The PTX string literal in vadd.c."""
    text = VADD_C.read_text()
    literal = text[text.index("VADD_PTX[] =") : text.index(";\n", text.index("VADD_PTX[] ="))]
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', literal)).replace("\\n", "\n")


def vadd_guest(api: WasiCuda) -> Guest:
    return Guest(api, VADD_WAT.read_text())


# --- the contract: signatures, docs and header agree ---------------------------------------


def test_imports_link_with_the_documented_signatures() -> None:
    documented = dict(re.findall(r"^\| `(\w+)` \| `(\([^`]*\) -> i32)` \|", DOC.read_text(), re.MULTILINE))
    assert documented == {spec.name: spec.signature for spec in IMPORTS}
    store = wasmtime.Store()
    for name, func in WasiCuda().host_functions(store).items():
        ty = func.type(store)
        params = ", ".join(
            f"{param}: {kind}" for (param, _), kind in zip(IMPORTS_BY_NAME[name].params, ty.params)
        )
        assert f"({params}) -> {', '.join(map(str, ty.results))}" == documented[name]
    # The example guests link against the same definitions.
    for wasm in (VADD_WASM.read_bytes(), wasmtime.wat2wasm(VADD_WAT.read_text())):
        linker, store, module = _linker_for(bytes(wasm))
        linker.define_wasi()
        store.set_wasi(wasmtime.WasiConfig())
        assert define_if_imported(linker, store, module) is not None
        linker.instantiate(store, module)


def _linker_for(wasm: bytes) -> tuple[wasmtime.Linker, wasmtime.Store, wasmtime.Module]:
    engine = wasmtime.Engine()
    return wasmtime.Linker(engine), wasmtime.Store(engine), wasmtime.Module(engine, wasm)


def test_a_wrong_signature_does_not_link() -> None:
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    WasiCuda().define(linker, store)
    wat = f'(module (import "{IMPORT_MODULE}" "mem_alloc" (func (param i32) (result i32))))'
    with pytest.raises(wasmtime.WasmtimeError, match="mem_alloc"):
        linker.instantiate(store, wasmtime.Module(engine, wasmtime.wat2wasm(wat)))


def test_status_codes_are_documented_and_in_the_header() -> None:
    doc, header = DOC.read_text(), HEADER.read_text()
    for status in Status:
        value = str(status.value) if status.value >= 0 else f"({status.value})"
        assert f"| `{status.c_name}` | {status.value} |" in doc, status
        assert re.search(rf"#define {status.c_name} {re.escape(value)}\s", header), status
    assert len({s.value for s in Status}) == len(Status)
    assert all(s.value < 0 for s in Status if s is not Status.OK)


_C_TYPES = {"int32_t": "i32", "uint32_t": "i32", "int64_t": "i64", "uint64_t": "i64", "void": None}


def _header_prototypes() -> dict[str, list[str]]:
    """import name -> wasm parameter types, from each prototype in wasi_cuda.h."""
    text = HEADER.read_text()
    found = {}
    for name, c_name, params in re.findall(r"WASI_CUDA_IMPORT\((\w+)\)\s*int32_t (\w+)\(([^)]*)\);", text):
        assert c_name == f"wasi_cuda_{name}"
        types = []
        for param in (p.strip() for p in params.split(",")):
            if param == "void":
                continue
            if "*" in param:
                types.append("i32")  # wasm32 pointers
            else:
                types.append(_C_TYPES[param.split()[0]])
        found[name] = types
    return found


def test_header_declares_every_import_with_its_wasm_types() -> None:
    prototypes = _header_prototypes()
    assert prototypes == {spec.name: [t for _, t in spec.params] for spec in IMPORTS}
    header = HEADER.read_text()
    for tag in ArgTag:
        assert f"#define WASI_CUDA_ARG_{tag.name} {tag.value} " in header
    assert f'import_module("{IMPORT_MODULE}")' in header
    assert ARG_RECORD.size == 16 and "sizeof(wasi_cuda_arg) == 16" in header
    assert header in DOC.read_text(), "docs/wasi-cuda.md must quote the header as it is"


def test_every_row_has_an_implementation() -> None:
    api = WasiCuda()
    for spec in IMPORTS:
        assert callable(getattr(api, f"_{spec.name}")), spec.name


@pytest.mark.parametrize(
    ("name", "ptx"), [("vadd.wat", vadd_ptx), ("vadd.c", c_vadd_ptx), ("test", lambda: TEST_PTX)]
)
@pytest.mark.parametrize("arch", ARCHES)
def test_shipped_ptx_assembles(name: str, ptx: Any, arch: str, tmp_path: Path) -> None:
    ptxas = find_ptxas()
    assert ptxas, "ptxas not found: install the test extras (nvidia-cuda-nvcc) or the CUDA toolkit"
    text = ptx()
    assert text.isascii()
    if name != "test":
        assert ".version 7.0\n.target sm_75\n" in text
        assert ".entry vadd(" in text
    src = tmp_path / "k.ptx"
    src.write_text(text)
    proc = subprocess.run(
        [ptxas, f"-arch={arch}", str(src), "-o", str(tmp_path / "k.cubin")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def test_wat_and_c_guests_ship_the_same_kernel() -> None:
    assert vadd_ptx() == c_vadd_ptx()


# --- without a GPU -------------------------------------------------------------------------


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the driver report no GPU for this test, on every machine."""
    monkeypatch.setattr(driver, "_init_failure", "no usable GPU: hidden for this test")
    monkeypatch.setattr(Context, "_instances", {})


def _valid_call(guest: Guest, spec: HostImport) -> int:
    """A call of ``spec`` whose pointers and plain values are all acceptable."""
    guest.write(PTX_AT, b".version 7.0\n.target sm_75\n")
    guest.write(NAME_AT, b"vadd")
    guest.write(ARGS_AT, ARG_RECORD.pack(ArgTag.I32, 0, 7))
    args = {
        "module_load": (PTX_AT, 26),
        "module_unload": (1,),
        "module_get_function": (1, NAME_AT, 4),
        "mem_alloc": (64,),
        "mem_free": (1,),
        "memcpy_htod": (1, 0, DATA_AT, 64),
        "memcpy_dtoh": (DATA_AT, 1, 0, 64),
        "launch": (1, 1, 1, 1, 32, 1, 1, 0, ARGS_AT, 1),
        "synchronize": (),
    }[spec.name]
    return guest(spec.name, *args)


@pytest.mark.usefixtures("no_gpu")
def test_without_a_gpu_every_gpu_call_says_so() -> None:
    guest = Guest(WasiCuda())
    for spec in IMPORTS:
        if spec.gpu:
            assert _valid_call(guest, spec) == Status.NO_GPU, spec.name
            assert "no usable GPU" in guest.error()
            assert guest.error().startswith(f"{spec.name}: ")


@pytest.mark.usefixtures("no_gpu")
def test_without_a_gpu_the_wat_guest_gets_no_gpu() -> None:
    api = WasiCuda()
    assert vadd_guest(api)("run", 100) == Status.NO_GPU
    assert "no usable GPU" in api.last_error


# Each bad pointer of each call that takes one: (call, arguments, what the message names).
BAD_POINTERS = [
    ("module_load", (MEMORY_BYTES, 1), "PTX"),
    ("module_load", (MEMORY_BYTES - 4, 8), "PTX"),
    ("module_load", (i32(0xFFFFFFF0), 0x20), "wraps"),
    ("module_get_function", (1, MEMORY_BYTES - 2, 4), "kernel name"),
    ("memcpy_htod", (1, 0, MEMORY_BYTES - 64, 65), "memcpy_htod source"),
    ("memcpy_htod", (1, 0, 16, i32(0xFFFFFFFF)), "memcpy_htod source"),
    ("memcpy_dtoh", (MEMORY_BYTES, 1, 0, 1), "memcpy_dtoh destination"),
    ("memcpy_dtoh", (i32(0x80000000), 1, 0, 4), "memcpy_dtoh destination"),
    ("launch", (1, 1, 1, 1, 1, 1, 1, 0, MEMORY_BYTES - 16, 2), "argument records"),
    ("launch", (1, 1, 1, 1, 1, 1, 1, 0, i32(0xFFFFFFF0), 1), "argument records"),
    ("last_error", (MEMORY_BYTES - 8, 16), "last_error buffer"),
]


@pytest.mark.usefixtures("no_gpu")
@pytest.mark.parametrize(("call", "args", "named"), BAD_POINTERS)
def test_bad_guest_pointers_are_refused_before_the_gpu_check(call: str, args: tuple, named: str) -> None:
    api = WasiCuda()
    guest = Guest(api)
    assert guest(call, *args) == Status.BAD_POINTER
    assert named in api.last_error
    assert "outside the guest's linear memory" in api.last_error


@pytest.mark.usefixtures("no_gpu")
def test_pointers_at_the_very_end_of_memory_are_accepted() -> None:
    guest = Guest(WasiCuda())
    assert guest("memcpy_htod", 1, 0, MEMORY_BYTES, 0) == Status.NO_GPU
    assert guest("memcpy_dtoh", MEMORY_BYTES - 4, 1, 0, 4) == Status.NO_GPU
    assert guest("last_error", MEMORY_BYTES, 0) > 0


@pytest.mark.usefixtures("no_gpu")
def test_a_guest_without_exported_memory_gets_bad_pointer() -> None:
    api = WasiCuda()
    guest = Guest(api, memory=False)
    assert guest("module_load", 0, 4) == Status.BAD_POINTER
    assert "exports no" in api.last_error
    assert guest("mem_alloc", 16) == Status.NO_GPU  # no pointer: no memory needed


def _record(tag: int, handle: int = 0, payload: int = 0) -> bytes:
    return ARG_RECORD.pack(tag, handle, payload)


BAD_VALUES = [
    ("module_load", b"", (PTX_AT, 0), Status.BAD_ARGUMENT, "empty"),
    ("module_load", b"\0\0\0", (PTX_AT, 3), Status.BAD_ARGUMENT, "empty"),
    ("module_load", b".version 7.0\0junk", (PTX_AT, 17), Status.BAD_ARGUMENT, "NUL"),
    ("module_load", ".target sm_75 // \u00e9".encode(), (PTX_AT, 19), Status.BAD_ARGUMENT, "ASCII"),
    ("module_get_function", b"", (1, NAME_AT, 0), Status.BAD_ARGUMENT, "empty"),
    ("module_get_function", b"x" * 1025, (1, NAME_AT, 1025), Status.BAD_ARGUMENT, "too long"),
    ("mem_alloc", b"", (0,), Status.BAD_ARGUMENT, "0 bytes"),
    ("launch", _record(9), (1, 1, 1, 1, 1, 1, 1, 0, ARGS_AT, 1), Status.BAD_ARGUMENT, "tag 9"),
    ("launch", _record(0), (1, 1, 1, 1, 1, 1, 1, 0, ARGS_AT, 1), Status.BAD_ARGUMENT, "tag 0"),
    ("launch", _record(ArgTag.I64, 3, 5), (1, 1, 1, 1, 1, 1, 1, 0, ARGS_AT, 1), Status.BAD_ARGUMENT, "handle field"),
    ("launch", _record(ArgTag.BUFFER, 0, 0), (1, 1, 1, 1, 1, 1, 1, 0, ARGS_AT, 1), Status.BAD_HANDLE, "without a handle"),
    ("launch", b"", (1, 1, 1, 1, 1, 1, 1, 0, ARGS_AT, MAX_ARGS + 1), Status.BAD_ARGUMENT, "at most"),
    ("launch", b"", (1, 0, 1, 1, 1, 1, 1, 0, ARGS_AT, 0), Status.BAD_LAUNCH, ">= 1"),
    ("launch", b"", (1, 1, 1, 1, 1, 1, 0, 0, ARGS_AT, 0), Status.BAD_LAUNCH, ">= 1"),
]  # fmt: skip


@pytest.mark.usefixtures("no_gpu")
@pytest.mark.parametrize(("call", "data", "args", "status", "named"), BAD_VALUES)
def test_bad_values_are_refused_before_the_gpu_check(
    call: str, data: bytes, args: tuple, status: Status, named: str
) -> None:
    api = WasiCuda()
    guest = Guest(api)
    guest.write({"module_load": PTX_AT, "launch": ARGS_AT}.get(call, NAME_AT), data)
    assert guest(call, *args) == status
    assert named in api.last_error


@pytest.mark.usefixtures("no_gpu")
def test_last_error_truncates_and_returns_the_full_length() -> None:
    api = WasiCuda()
    guest = Guest(api)
    assert guest("last_error", DATA_AT, 64) == 0  # nothing failed yet
    assert guest("mem_alloc", 16) == Status.NO_GPU
    message = api.last_error.encode()
    guest.write(DATA_AT, b"\xaa" * 32)
    assert guest("last_error", DATA_AT, 10) == len(message)
    assert guest.read(DATA_AT, 11) == message[:10] + b"\xaa"
    assert guest.error() == api.last_error  # reading it does not clear it


def test_define_if_imported_only_for_wasi_cuda_modules() -> None:
    plain = wasmtime.wat2wasm('(module (import "env" "f" (func)))')
    assert define_if_imported(*_linker_for(bytes(plain))) is None
    typo = wasmtime.wat2wasm(
        f'(module (import "{IMPORT_MODULE}" "mem_allocate" (func (param i64) (result i32))))'
    )
    with pytest.raises(TensorWasmError, match="mem_allocate, which the API does not have"):
        define_if_imported(*_linker_for(bytes(typo)))


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tensorwasm", "run", *args],
        capture_output=True, text=True, check=False, cwd=ROOT, env={**os.environ, **(env or {})},
    )  # fmt: skip


def test_tensorwasm_run_defines_the_api_without_a_gpu() -> None:
    hidden = {"CUDA_VISIBLE_DEVICES": ""}  # the same outcome on a GPU machine
    proc = _cli(str(VADD_WASM), "1000", env=hidden)
    assert proc.returncode == 2, proc.stderr
    assert "vadd: no GPU: module_load: no usable GPU" in proc.stderr
    proc = _cli("--offload", "off", str(VADD_WAT), "--invoke", "run", "1000", env=hidden)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(int(Status.NO_GPU))


# --- a stand-in driver: the whole API on any machine -------------------------------------------


class FakeGPU:
    """The driver calls the API makes, over host memory: allocations are host buffers and
    the kernels vadd, address_of and trap_now run in Python. Every call is logged; an
    access outside a live allocation makes the context sticky-faulted, as on a GPU."""

    PARAMS = {"vadd": (8, 8, 8, 4), "address_of": (8,), "trap_now": ()}
    DEVICE = {
        "MAX_GRID_DIM_X": 2**31 - 1, "MAX_GRID_DIM_Y": 65535, "MAX_GRID_DIM_Z": 65535,
        "MAX_BLOCK_DIM_X": 1024, "MAX_BLOCK_DIM_Y": 1024, "MAX_BLOCK_DIM_Z": 64,
        "MAX_THREADS_PER_BLOCK": 1024, "MAX_SHARED_MEMORY_PER_BLOCK": 48 << 10,
    }  # fmt: skip

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.allocations: dict[int, ctypes.Array] = {}
        self.calls: list[str] = []
        self.sticky: Any = None
        self.launch_error: Any = None
        self.context = Context(DeviceInfo(0, "fake", (9, 0), 13000, 1 << 30, 132), device=None, handle=None)
        attributes = {
            getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}"): value
            for name, value in self.DEVICE.items()
        }
        fn_attr = cu.CUfunction_attribute
        fn_attributes = {
            fn_attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: 1024,
            fn_attr.CU_FUNC_ATTRIBUTE_NUM_REGS: 16,
        }
        fakes = {
            "cuCtxSetCurrent": lambda handle: (R.CUDA_SUCCESS,),
            "cuCtxSynchronize": lambda: (self.sticky or R.CUDA_SUCCESS,),
            "cuMemGetInfo": lambda: (R.CUDA_SUCCESS, 1 << 30, 1 << 30),
            "cuMemAlloc": self._alloc,
            "cuMemFree": self._free,
            "cuMemcpyHtoD": lambda dst, src, n: self._copy(dst, src, n, device=dst),
            "cuMemcpyDtoH": lambda dst, src, n: self._copy(dst, src, n, device=src),
            "cuMemGetAddressRange": self._address_range,
            "cuModuleLoadDataEx": self._load,
            "cuModuleUnload": lambda module: (R.CUDA_SUCCESS,),
            "cuModuleGetFunction": self._function,
            "cuFuncGetParamInfo": self._param_info,
            "cuFuncGetAttribute": lambda attr, f: (R.CUDA_SUCCESS, fn_attributes.get(attr, 0)),
            "cuDeviceGet": lambda ordinal: (R.CUDA_SUCCESS, 0),
            "cuDeviceGetAttribute": lambda attr, device: (R.CUDA_SUCCESS, attributes[attr]),
            "cuLaunchKernel": self._launch,
        }
        for name, fake in fakes.items():
            monkeypatch.setattr(cu, name, self._logged(name, fake))
        monkeypatch.setenv("TENSORWASM_PTXAS", "off")  # modules go to the fake driver's JIT

    def _logged(self, name: str, fake: Any) -> Any:
        def call(*args: Any) -> Any:
            self.calls.append(name)
            return fake(*args)

        return call

    def api(self, limit: int | None = None) -> WasiCuda:
        return WasiCuda(limit=limit, context=self.context)

    def _alloc(self, nbytes: int) -> tuple[Any, int]:
        buffer = ctypes.create_string_buffer(nbytes)
        self.allocations[ctypes.addressof(buffer)] = buffer
        return R.CUDA_SUCCESS, ctypes.addressof(buffer)

    def _free(self, ptr: int) -> tuple[Any]:
        del self.allocations[ptr]
        return (R.CUDA_SUCCESS,)

    def inside(self, ptr: int, nbytes: int) -> bool:
        return any(base <= ptr and ptr + nbytes <= base + len(b) for base, b in self.allocations.items())

    def _copy(self, dst: int, src: int, nbytes: int, device: int) -> tuple[Any]:
        if self.sticky:
            return (self.sticky,)
        if not self.inside(device, nbytes):
            self.sticky = R.CUDA_ERROR_ILLEGAL_ADDRESS
            return (self.sticky,)
        ctypes.memmove(dst, src, nbytes)
        return (R.CUDA_SUCCESS,)

    def _address_range(self, ptr: Any) -> tuple[Any, int, int]:
        for base, buffer in self.allocations.items():
            if base <= int(ptr) < base + len(buffer):
                return R.CUDA_SUCCESS, base, len(buffer)
        return R.CUDA_ERROR_NOT_FOUND, 0, 0

    def _load(self, image: bytes, count: int, options: list, values: list) -> tuple[Any, Any]:
        if b".entry" not in image:
            values[0][:22] = b"ptxas fatal: no entry\0"
            return R.CUDA_ERROR_INVALID_PTX, None
        return R.CUDA_SUCCESS, image

    def _function(self, module: bytes, name: bytes) -> tuple[Any, Any]:
        if name.decode() in self.PARAMS and b".entry " + name + b"(" in module:
            return R.CUDA_SUCCESS, name.decode()
        return R.CUDA_ERROR_NOT_FOUND, None

    def _param_info(self, function: str, index: int) -> tuple[Any, int, int]:
        sizes = self.PARAMS[function]
        if index >= len(sizes):
            return R.CUDA_ERROR_INVALID_VALUE, 0, 0
        return R.CUDA_SUCCESS, 8 * index, sizes[index]

    def _launch(
        self, function: str, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, *rest: Any
    ) -> tuple[Any]:
        _shared, _stream, params, _extra = rest
        if self.launch_error:
            return (self.launch_error,)
        slots = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        if function == "trap_now":
            self.sticky = R.CUDA_ERROR_LAUNCH_FAILED
        elif function == "address_of":
            out = ctypes.c_uint64.from_address(slots[0]).value
            if self.inside(out, 8):
                ctypes.c_uint64.from_address(out).value = out
            else:
                self.sticky = R.CUDA_ERROR_ILLEGAL_ADDRESS
        else:
            a, b, c = (ctypes.c_uint64.from_address(slots[i]).value for i in range(3))
            n = min(ctypes.c_uint32.from_address(slots[3]).value, gx * bx)
            if not all(self.inside(p, 4 * n) for p in (a, b, c)):
                self.sticky = R.CUDA_ERROR_ILLEGAL_ADDRESS
                return (R.CUDA_SUCCESS,)
            view = [np.ctypeslib.as_array((ctypes.c_float * n).from_address(p)) for p in (a, b, c)]
            view[2][:] = view[0] + view[1]
        return (R.CUDA_SUCCESS,)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGPU:
    return FakeGPU(monkeypatch)


def test_fake_gpu_runs_the_wat_guest(gpu: FakeGPU) -> None:
    api = gpu.api()
    guest = vadd_guest(api)
    for n in (1, 255, 1000, 16384):
        assert guest("run", n) == 0, api.last_error
    assert guest("run", 16385) == -1000
    assert gpu.calls.count("cuLaunchKernel") == 4
    assert not gpu.allocations and api.device_memory_used == 0  # the guest freed everything


def test_fake_gpu_verification_catches_a_wrong_kernel(gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch) -> None:
    # The guest must notice a kernel that does not add: the comparison is not vacuous.
    launch = cu.cuLaunchKernel

    def half(*args: Any) -> Any:
        result = launch(*args)
        slots = ctypes.cast(args[-2], ctypes.POINTER(ctypes.c_void_p))
        c = ctypes.c_uint64.from_address(slots[2]).value
        ctypes.c_float.from_address(c + 8).value += 1.0
        return result

    monkeypatch.setattr(cu, "cuLaunchKernel", half)
    assert vadd_guest(gpu.api())("run", 100) == 1


@pytest.mark.parametrize("offload", ["off", "always"])
def test_fake_gpu_runs_the_c_guest_under_tensorwasm_run(
    gpu: FakeGPU, offload: str, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from tensorwasm.runtime.run import run

    monkeypatch.setattr(Context, "get", classmethod(lambda cls, ordinal=0: gpu.context))
    status, _, _ = run(VADD_WASM.read_bytes(), ["vadd", "5000"], device="cpu", offload=offload)
    out, err = capfd.readouterr()
    assert (status, out) == (0, "vadd n=5000 ok\n"), err
    assert gpu.calls.count("cuLaunchKernel") == 1


def test_copies_past_a_buffer_are_refused_before_the_driver(gpu: FakeGPU) -> None:
    api = gpu.api()
    guest = Guest(api)
    buffer = guest("mem_alloc", 64)
    assert buffer > 0
    for call, args in [
        ("memcpy_htod", (buffer, 0, DATA_AT, 65)),
        ("memcpy_htod", (buffer, 60, DATA_AT, 5)),
        ("memcpy_htod", (buffer, -1, DATA_AT, 1)),  # offsets are unsigned: 2**64 - 1
        ("memcpy_dtoh", (DATA_AT, buffer, 64, 1)),
        ("memcpy_dtoh", (DATA_AT, buffer, 1 << 62, 4)),
    ]:
        assert guest(call, *args) == Status.BAD_RANGE, (call, args)
        assert "64-byte buffer" in api.last_error
    assert "cuMemcpyHtoD" not in gpu.calls and "cuMemcpyDtoH" not in gpu.calls
    guest.write(DATA_AT, bytes(range(64)))
    assert guest("memcpy_htod", buffer, 0, DATA_AT, 64) == Status.OK
    assert api.last_error == ""  # a success clears it
    assert guest("memcpy_dtoh", DATA_AT + 100, buffer, 60, 4) == Status.OK
    assert guest.read(DATA_AT + 100, 4) == bytes([60, 61, 62, 63])
    assert guest("memcpy_htod", buffer, 64, DATA_AT, 0) == Status.OK  # empty copy at the end


def test_handles_are_checked_for_liveness_kind_and_owner(gpu: FakeGPU) -> None:
    first, second = Guest(gpu.api()), Guest(gpu.api())
    buffer = first("mem_alloc", 64)
    module = first.load(TEST_PTX)
    function = first.function(module, "address_of")
    assert min(buffer, module, function) > 0
    # Another instance cannot use them, even when it has handles of its own.
    assert second("mem_alloc", 64) > 0
    assert second("mem_free", buffer) == Status.BAD_HANDLE
    assert "not a live handle of this instance" in second.api.last_error
    assert second("memcpy_htod", buffer, 0, DATA_AT, 8) == Status.BAD_HANDLE
    assert second.function(module, "address_of") == Status.BAD_HANDLE
    assert second.launch(function, []) == Status.BAD_HANDLE
    own = second.load(TEST_PTX)
    assert second.launch(second.function(own, "address_of"), [buffer_arg(buffer)]) == Status.BAD_HANDLE
    # The wrong kind, and numbers that were never handles.
    assert first("mem_free", module) == Status.BAD_HANDLE
    assert "is a module, not a buffer" in first.api.last_error
    assert first.launch(buffer, []) == Status.BAD_HANDLE
    assert first("memcpy_htod", function, 0, DATA_AT, 8) == Status.BAD_HANDLE
    for bogus in (0, -1, 123456789):
        assert first("mem_free", bogus) == Status.BAD_HANDLE
    # Freed is gone; the owner's handles still work.
    assert first("mem_free", buffer) == Status.OK
    assert first("mem_free", buffer) == Status.BAD_HANDLE
    assert first("module_unload", module) == Status.OK
    assert first.launch(function, []) == Status.BAD_HANDLE  # its kernels went with it


def test_kernel_arguments_are_checked_against_the_kernel(gpu: FakeGPU) -> None:
    api = gpu.api()
    guest = Guest(api)
    module = guest.load(TEST_PTX)
    function = guest.function(module, "address_of")
    buffer = guest("mem_alloc", 8)
    assert guest.launch(function, [buffer_arg(buffer)]) == Status.OK
    assert guest("synchronize") == Status.OK
    assert guest("memcpy_dtoh", DATA_AT, buffer, 0, 8) == Status.OK
    (address,) = struct.unpack("<Q", guest.read(DATA_AT, 8))
    launches = gpu.calls.count("cuLaunchKernel")
    refused = [
        ([], Status.BAD_ARGUMENT, "takes 1 parameters, got 0"),
        ([buffer_arg(buffer), buffer_arg(buffer)], Status.BAD_ARGUMENT, "takes 1 parameters, got 2"),
        ([(ArgTag.I32, 0, 5)], Status.BAD_ARGUMENT, "I32 (4 bytes)"),
        ([(ArgTag.F32, 0, 5)], Status.BAD_ARGUMENT, "F32 (4 bytes)"),
        ([(ArgTag.I64, 0, address)], Status.BAD_ARGUMENT, "is a device address"),
        ([(ArgTag.I64, 0, address + 7)], Status.BAD_ARGUMENT, "is a device address"),
        ([buffer_arg(buffer, 9)], Status.BAD_RANGE, "argument 0"),
        ([buffer_arg(module)], Status.BAD_HANDLE, "not a buffer"),
        ([buffer_arg(0x7654321)], Status.BAD_HANDLE, "not a live handle"),
    ]
    for args, status, named in refused:
        assert guest.launch(function, args) == status, args
        assert named in api.last_error, api.last_error
    assert gpu.calls.count("cuLaunchKernel") == launches  # none reached the driver
    # A pointer one past the end is a pointer (vadd of 0 elements touches none of them).
    vadd = guest.function(guest.load(vadd_ptx()), "vadd")
    assert guest.launch(vadd, [buffer_arg(buffer, 8)] * 3 + [(ArgTag.I32, 0, 0)]) == Status.OK
    assert guest("synchronize") == Status.OK
    # A plain integer is passed as it is; what the kernel does with it is beyond the checks,
    # and address_of writes through it: the fault is caught at the next synchronize.
    assert guest.launch(function, [(ArgTag.I64, 0, 0x1000)]) == Status.OK
    assert guest("synchronize") == Status.FAULTED


def test_launch_dims_are_checked_against_the_device(gpu: FakeGPU) -> None:
    api = gpu.api()
    guest = Guest(api)
    function = guest.function(guest.load(TEST_PTX), "trap_now")
    for grid, block, shared, named in [
        ((1, 65536, 1), (1, 1, 1), 0, "grid y = 65536"),
        ((1, 1, 1), (1025, 1, 1), 0, "block x = 1025"),
        ((1, 1, 1), (1, 1, 65), 0, "block z = 65"),
        ((1, 1, 1), (32, 32, 2), 0, "2048 threads per block"),
        ((1, 1, 1), (1, 1, 1), (48 << 10) + 1, "dynamic shared memory"),
        ((i32(0x80000000), 1, 1), (1, 1, 1), 0, "grid x = 2147483648"),
    ]:
        assert guest.launch(function, [], grid, block, shared) == Status.BAD_LAUNCH
        assert named in api.last_error
    assert "cuLaunchKernel" not in gpu.calls


def test_allocations_stay_within_the_instance_cap(gpu: FakeGPU) -> None:
    api = gpu.api(limit=4096)
    guest = Guest(api)
    assert guest("mem_alloc", 8192) == Status.OUT_OF_MEMORY
    assert "cap" in api.last_error
    first = guest("mem_alloc", 4096)
    assert first > 0
    assert guest("mem_alloc", 1) == Status.OUT_OF_MEMORY
    assert guest("mem_alloc", -1) == Status.OUT_OF_MEMORY  # 2**64 - 1 bytes
    assert guest("mem_free", first) == Status.OK
    assert guest("mem_alloc", 2048) > 0
    assert api.device_memory_used == 2048
    # Each instance has its own cap.
    assert Guest(gpu.api(limit=4096))("mem_alloc", 4096) > 0
    # The vadd guest needs three buffers of 4 * n bytes.
    assert vadd_guest(gpu.api(limit=8000))("run", 1000) == Status.OUT_OF_MEMORY


def test_module_load_and_lookup_errors(gpu: FakeGPU) -> None:
    api = gpu.api()
    guest = Guest(api)
    assert guest.load(".version 7.0\n.target sm_75\n.address_size 64\nnot ptx") == Status.MODULE_LOAD
    assert "ptxas fatal: no entry" in api.last_error
    newer = TEST_PTX.replace("sm_75", "sm_100")
    loads = gpu.calls.count("cuModuleLoadDataEx")
    assert guest.load(newer) == Status.MODULE_LOAD
    assert "targets sm_100, newer than this GPU (sm_90)" in api.last_error
    assert gpu.calls.count("cuModuleLoadDataEx") == loads
    module = guest.load(TEST_PTX + "\0\0")  # a C string's terminator is fine
    assert module > 0
    assert guest.function(module, "vadd") == Status.NOT_FOUND
    assert "address_of, trap_now" in api.last_error


def test_a_sticky_fault_refuses_every_later_gpu_call(gpu: FakeGPU) -> None:
    api = gpu.api()
    guest, other = Guest(api), Guest(gpu.api())
    buffer = guest("mem_alloc", 64)
    module = guest.load(TEST_PTX)
    assert guest.launch(guest.function(module, "trap_now"), []) == Status.OK
    assert guest("synchronize") == Status.FAULTED
    assert "CUDA_ERROR_LAUNCH_FAILED" in api.last_error and "unusable" in api.last_error
    calls = len(gpu.calls)
    for spec in IMPORTS:
        if spec.gpu:
            assert _valid_call(guest, spec) == Status.FAULTED, spec.name
            assert "CUDA_ERROR_LAUNCH_FAILED" in api.last_error
    assert other("mem_alloc", 64) == Status.FAULTED  # the context is shared
    assert len(gpu.calls) == calls  # nothing more was asked of the dead context
    assert guest("mem_free", buffer) == Status.FAULTED
    api.close()  # releases nothing on a dead context, raises nothing


def test_other_driver_errors_leave_the_api_usable(gpu: FakeGPU) -> None:
    api = gpu.api()
    guest = Guest(api)
    function = guest.function(guest.load(TEST_PTX), "trap_now")
    gpu.launch_error = R.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    assert guest.launch(function, []) == Status.DRIVER
    assert "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES" in api.last_error
    gpu.launch_error = None
    assert guest("mem_alloc", 64) > 0


def test_a_host_bug_is_a_status_not_a_trap(gpu: FakeGPU, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(cu, "cuCtxSynchronize", broken)
    api = gpu.api()
    assert Guest(api)("synchronize") == Status.INTERNAL
    assert "boom" in api.last_error


def test_close_frees_what_the_guest_left(gpu: FakeGPU) -> None:
    api = gpu.api(limit=1 << 20)
    guest = Guest(api)
    for _ in range(3):
        assert guest("mem_alloc", 1000) > 0
    assert guest.load(TEST_PTX) > 0
    assert len(gpu.allocations) == 3
    api.close()
    assert not gpu.allocations and api.device_memory_used == 0
    assert gpu.calls.count("cuModuleUnload") == 1


# --- on a GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
def test_wat_guest_adds_vectors_on_the_gpu() -> None:
    with WasiCuda() as api:
        guest = vadd_guest(api)
        for n in (1, 1000, 16384):
            assert guest("run", n) == 0, api.last_error
        assert api.device_memory_used == 0


@pytest.mark.gpu
def test_guests_run_under_tensorwasm_run_on_the_gpu() -> None:
    # Offload off: the subject is the API, not how the guests' own loops run.
    proc = _cli("--offload", "off", str(VADD_WASM), "100000")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "vadd n=100000 ok\n"
    proc = _cli("--offload", "off", str(VADD_WAT), "--invoke", "run", "16384")
    assert (proc.returncode, proc.stdout.strip()) == (0, "0"), proc.stderr


@pytest.mark.gpu
def test_c_guest_with_its_loops_offloaded_on_the_gpu() -> None:
    # The guest's fill loop runs as an offloaded kernel next to the guest's own kernel.
    proc = _cli("--offload", "always", "--report", "text", str(VADD_WASM), "100000")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "vadd n=100000 ok\n"
    assert "ran 1/1 times on gpu" in proc.stderr


@pytest.mark.gpu
def test_bad_guest_pointer_is_refused_and_the_gpu_stays_usable() -> None:
    with WasiCuda() as api:
        guest = Guest(api, shim_wat())
        buffer = guest("mem_alloc", 4096)
        assert buffer > 0
        assert guest("memcpy_htod", buffer, 0, MEMORY_BYTES - 100, 4096) == Status.BAD_POINTER
        assert guest("memcpy_dtoh", i32(0xFFFFF000), buffer, 0, 4096) == Status.BAD_POINTER
        guest.write(DATA_AT, bytes(range(256)) * 16)
        assert guest("memcpy_htod", buffer, 0, DATA_AT, 4096) == Status.OK
        assert guest("memcpy_dtoh", DATA_AT + 8192, buffer, 0, 4096) == Status.OK
        assert guest.read(DATA_AT + 8192, 4096) == bytes(range(256)) * 16
        assert vadd_guest(api)("run", 1000) == 0, api.last_error


@pytest.mark.gpu
def test_non_handle_kernel_arguments_are_refused_before_launch() -> None:
    with WasiCuda() as api:
        guest = Guest(api)
        module = guest.load(TEST_PTX)
        function = guest.function(module, "address_of")
        buffer = guest("mem_alloc", 8)
        assert min(module, function, buffer) > 0, api.last_error
        # Let the guest learn the buffer's device address, then try to pass it back raw.
        assert guest.launch(function, [buffer_arg(buffer)]) == Status.OK
        assert guest("synchronize") == Status.OK
        assert guest("memcpy_dtoh", DATA_AT, buffer, 0, 8) == Status.OK
        (address,) = struct.unpack("<Q", guest.read(DATA_AT, 8))
        assert address != 0
        for args, status in [
            ([(ArgTag.I64, 0, address)], Status.BAD_ARGUMENT),
            ([(ArgTag.I64, 0, address + 4)], Status.BAD_ARGUMENT),
            ([(ArgTag.I32, 0, address & 0xFFFFFFFF)], Status.BAD_ARGUMENT),
            ([buffer_arg(module)], Status.BAD_HANDLE),
            ([buffer_arg(0x7654321)], Status.BAD_HANDLE),
            ([buffer_arg(buffer, 4096)], Status.BAD_RANGE),
            ([], Status.BAD_ARGUMENT),
        ]:
            assert guest.launch(function, args) == status, (args, api.last_error)
        assert guest.launch(function, [], block=(2048, 1, 1)) == Status.BAD_LAUNCH
        assert guest("synchronize") == Status.OK  # none of them reached the GPU
        assert vadd_guest(api)("run", 1000) == 0, api.last_error


@pytest.mark.gpu
def test_allocation_over_the_cap_is_refused_and_a_smaller_one_works() -> None:
    with WasiCuda(limit=1 << 20) as api:
        guest = Guest(api)
        assert guest("mem_alloc", 2 << 20) == Status.OUT_OF_MEMORY
        assert "cap" in api.last_error
        whole = guest("mem_alloc", 1 << 20)
        assert whole > 0, api.last_error
        assert guest("mem_alloc", 1) == Status.OUT_OF_MEMORY
        assert guest("mem_free", whole) == Status.OK
        assert guest("mem_alloc", 512 << 10) > 0
    with WasiCuda(limit=8000) as api:
        assert vadd_guest(api)("run", 1000) == Status.OUT_OF_MEMORY


@pytest.mark.gpu
def test_handles_of_one_instance_are_refused_by_another() -> None:
    with WasiCuda() as mine, WasiCuda() as theirs:
        first, second = Guest(mine), Guest(theirs)
        buffer = first("mem_alloc", 256)
        module = first.load(TEST_PTX)
        function = first.function(module, "address_of")
        assert min(buffer, module, function) > 0, mine.last_error
        assert second("mem_alloc", 256) > 0
        assert second("mem_free", buffer) == Status.BAD_HANDLE
        assert second("memcpy_dtoh", DATA_AT, buffer, 0, 8) == Status.BAD_HANDLE
        assert second.function(module, "address_of") == Status.BAD_HANDLE
        assert second.launch(function, [buffer_arg(buffer)]) == Status.BAD_HANDLE
        own = second.function(second.load(TEST_PTX), "address_of")
        assert second.launch(own, [buffer_arg(buffer)]) == Status.BAD_HANDLE
        assert first("mem_free", buffer) == Status.OK  # still the owner's


@pytest.mark.gpu
def test_module_load_error_carries_the_jit_log_and_the_gpu_stays_usable() -> None:
    with WasiCuda() as api:
        guest = Guest(api)
        assert (
            guest.load(".version 7.0\n.target sm_75\n.address_size 64\nthis is not ptx;")
            == Status.MODULE_LOAD
        )
        assert "rejected" in api.last_error
        assert guest.load(TEST_PTX.replace("sm_75", "sm_999")) == Status.MODULE_LOAD
        assert "newer than this GPU" in api.last_error
        module = guest.load(TEST_PTX)
        assert module > 0
        assert guest.function(module, "missing") == Status.NOT_FOUND
        assert vadd_guest(api)("run", 1000) == 0, api.last_error


@pytest.mark.gpu
def test_a_kernel_fault_is_reported_and_later_calls_are_refused() -> None:
    # A trap poisons the process's CUDA context: run it in a process of its own.
    code = textwrap.dedent(
        """
        from tensorwasm.runtime.wasi_cuda import Status, WasiCuda
        from tests.runtime.test_wasi_cuda import TEST_PTX, Guest
        api = WasiCuda()
        guest, other = Guest(api), Guest(WasiCuda())
        assert guest("mem_alloc", 64) > 0
        trap = guest.function(guest.load(TEST_PTX), "trap_now")
        assert guest.launch(trap, []) == Status.OK, api.last_error
        assert guest("synchronize") == Status.FAULTED, api.last_error
        assert "unusable" in api.last_error, api.last_error
        assert guest("mem_alloc", 64) == Status.FAULTED
        assert other("mem_alloc", 64) == Status.FAULTED
        api.close()
        print("refused")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "refused" in proc.stdout
