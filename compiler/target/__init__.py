"""Code generation targets: NVPTX by compute capability, and the host CPU.

Both take the same LLVM IR from the lowering. :class:`NVPTXTarget` names an SM
architecture and a PTX ISA version; :func:`nvptx_for_device` picks them from a device's
compute capability (sm_90 from 9.0, sm_80 from 8.0, sm_75 from 7.5; older devices are
refused) and the PTX ISA the installed driver accepts. :class:`HostTarget` compiles the IR
for this machine with MCJIT, so every kernel also runs where there is no GPU.
"""

from __future__ import annotations

import functools
import platform
import sys
import threading

from tensorwasm.compiler.errors import CompileError
from tensorwasm.support import logs
from tensorwasm.support.digest import sha256
from tensorwasm.support.lazy import LazyModule
from tensorwasm.support.records import record

ir = LazyModule("llvmlite.ir", globals(), "ir")  # the lowering's IR: a warm start needs none

# Loading LLVM's library takes ~0.2 s, which a warm start (code from the cache, kernels
# for the GPU) does not need.
llvm = LazyModule("llvmlite.binding", globals(), "llvm")

log = logs.get_logger(__name__)

NVPTX_TRIPLE = "nvptx64-nvidia-cuda"
#: The PTX code generator ``TENSORWASM_PTX_BACKEND=auto`` (the default) uses, per target: the
#: one measured faster while the oracle finds no difference (docs/benchmarks.md, "Code
#: generators"). sm_90: on the H200 both leave every output identical to wasmtime's, and
#: neither wins everywhere: libNVVM was 3 to 11% faster on gemm and stencil2d before
#: tiling, but slower on stencil3d at the large sizes (11 to 13%; 9% under Nsight Compute
#: at c29f651) and on saxpy (3%), and equal on the tiled gemm: LLVM. sm_75 and sm_80: no
#: GPU of theirs has measured libNVVM, so LLVM, the code generator every test runs.
AUTO_BACKEND = {"sm_75": "llvm", "sm_80": "llvm", "sm_90": "llvm"}
NVPTX_DATA_LAYOUT = "e-p6:32:32-i64:64-i128:128-i256:256-v16:16-v32:32-n16:32:64"
ARCHES = ("sm_75", "sm_80", "sm_90")
CODEGENS = ("llvm", "nvvm")  # who writes the PTX: LLVM's NVPTX backend, or libNVVM
# The PTX ISA version emitted for each architecture: the lowest that supports it and every
# instruction the lowering uses (min.NaN needs 7.0), so older drivers can load it too.
ARCH_PTX = {"sm_75": (7, 0), "sm_80": (7, 0), "sm_90": (7, 8)}
# The newest PTX ISA each CUDA driver version (major, minor) can JIT.
DRIVER_PTX = {
    (11, 0): (7, 0), (11, 1): (7, 1), (11, 2): (7, 2), (11, 3): (7, 3), (11, 4): (7, 4),
    (11, 5): (7, 5), (11, 6): (7, 6), (11, 7): (7, 7), (11, 8): (7, 8), (12, 0): (8, 0),
    (12, 1): (8, 1), (12, 2): (8, 2), (12, 3): (8, 3), (12, 4): (8, 4), (12, 5): (8, 5),
    (12, 6): (8, 5), (12, 8): (8, 7), (12, 9): (8, 8), (13, 0): (9, 0),
}  # fmt: skip

_LOCK = threading.Lock()


def driver_ptx_limit(driver_version: int) -> tuple[int, int]:
    """The newest PTX ISA a driver accepts; ``driver_version`` as cuDriverGetVersion gives it."""
    version = (driver_version // 1000, (driver_version % 1000) // 10)
    known = [v for v in DRIVER_PTX if v <= version]
    if not known:
        return (6, 0)
    return DRIVER_PTX[max(known)]


def arch_for_capability(capability: tuple[int, int]) -> str:
    if capability >= (9, 0):
        return "sm_90"
    if capability >= (8, 0):
        return "sm_80"
    if capability >= (7, 5):
        return "sm_75"
    major, minor = capability
    raise CompileError(
        f"compute capability {major}.{minor} is not supported: TensorWasm needs 7.5 (Turing) or newer"
    )


def pure_asm(b: ir.IRBuilder, ty: ir.Type, text: str, constraints: str, args: list[ir.Value]) -> ir.Value:
    """An inline asm that computes a value from its operands alone. LLVM cannot see
    through it (what it is for), but told that it touches no memory, it still moves loads
    and stores across it: an asm call without that attribute counts as a write to all
    memory, and keeps every load after it in place (the memory base, the trap slot)."""
    asm = ir.InlineAsm(ir.FunctionType(ty, [a.type for a in args]), text, constraints)
    call = b.call(asm, args, attrs=("nounwind", "readnone"))
    # It returns, too: without that, a store of its value counts as reached only if the
    # call comes back, and LLVM keeps a sum stored in every step of a loop in memory rather
    # than in a register (LICM's promotion). llvmlite's builder does not know the attribute.
    set.add(call.attributes, "willreturn")
    return call


class Target:
    """What the lowering asks of a target, and how it turns LLVM IR into code."""

    name: str
    triple: str
    data_layout: str
    is_gpu: bool

    # True where a load or store at an address that is not a multiple of its size faults
    # (Wasm allows any address: the lowering then tests the address, see memory.py).
    strict_alignment = False
    # The LLVM address space of pointers into linear memory.
    memory_address_space = 0

    def native_min_max(self, ty: ir.Type) -> bool:
        """True where llvm.minimum/maximum compile to one instruction with Wasm's rules."""
        return False

    def mark_entry(self, fn: ir.Function) -> None:
        pass

    def opaque_bit_op(self, b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
        """An integer and/or/xor that later passes must not fold into float operations."""
        return {"and": b.and_, "or": b.or_, "xor": b.xor}[op](x, y)

    def float_bits(self, b: ir.IRBuilder, value: ir.Value, int_type: ir.IntType) -> ir.Value:
        """The bits of a float as an integer that later passes keep an integer."""
        return b.bitcast(value, int_type)

    def opaque(self, b: ir.IRBuilder, value: ir.Value) -> ir.Value:
        """``value`` itself, through an empty inline asm the optimiser cannot see through."""
        return pure_asm(b, value.type, "", "=r,0", [value])

    def thread_index(self, fl, name: str, dim: str) -> ir.Value:
        raise CompileError(f"{name} needs a kernel launch on the {self.name} target")

    def target_machine(self) -> llvm.TargetMachine:
        raise NotImplementedError

    # Whether the -O2 pipeline's loop vectorizer runs: it finds nothing to widen in a
    # kernel for a target whose registers are 32 bits wide (NVPTX), and costs time.
    loop_vectorization = True

    def optimize(self, module: llvm.ModuleRef) -> None:
        """The standard -O2 pipeline; no fast-math flags exist in our IR for it to exploit."""
        tm = self.target_machine()
        pto = llvm.create_pipeline_tuning_options(speed_level=2)
        if not self.loop_vectorization:
            pto.loop_vectorization = pto.loop_interleaving = False
        pb = llvm.create_pass_builder(tm, pto)
        pb.getModulePassManager().run(module, pb)

    def codegen_machine(self, module: llvm.ModuleRef) -> llvm.TargetMachine:
        """The machine that writes ``module``'s code: the target's own, or one at level 0
        where a function is ``optnone`` (``compiler.lower.function.MAX_OPTIMISED_LOOP_DEPTH``):
        the code generator's own loop passes (induction variable users, loop strength
        reduction, machine sinking) cost time quadratic in the depth of a loop nest."""
        if any(b"optnone" in attrs.split() for fn in module.functions for attrs in fn.attributes):
            return self.unoptimised_machine()
        return self.target_machine()

    def unoptimised_machine(self) -> llvm.TargetMachine:
        raise NotImplementedError

    def parse(self, llvm_ir: str) -> llvm.ModuleRef:
        """LLVM IR text as a verified module, in this thread's LLVM context."""
        try:
            module = llvm.parse_assembly(llvm_ir, context=thread_context())
            module.verify()
        except RuntimeError as exc:
            raise CompileError(f"LLVM rejected the generated IR: {exc}") from exc
        return module


# LLVM's objects are not shared between threads: each thread that compiles parses into an
# LLVM context of its own (the global one's type tables are not locked) and emits code
# with target machines of its own. Kernels compile on worker threads (runtime.loop_kernels)
# while wasmtime runs on the main one. A context lives as long as the process: the code
# compiled in it may be called after its thread ended.
_PER_THREAD = threading.local()
_CONTEXTS: list[llvm.ContextRef] = []


def thread_context() -> llvm.ContextRef:
    """The calling thread's LLVM context."""
    context = getattr(_PER_THREAD, "context", None)
    if context is None:
        context = _PER_THREAD.context = llvm.create_context()
        with _LOCK:
            _CONTEXTS.append(context)
    return context


def per_thread_machine(make):
    """A target's ``target_machine`` memoised per target and thread (``make(target)``
    builds one): a machine is reused by every compile of its thread."""

    @functools.wraps(make)
    def machine(target: Target) -> llvm.TargetMachine:
        machines = getattr(_PER_THREAD, "machines", None)
        if machines is None:
            machines = _PER_THREAD.machines = {}
        found = machines.get(target)
        if found is None:
            found = machines[target] = make(target)
        return found

    return machine


@record(frozen=True)
class NVPTXTarget(Target):
    arch: str = "sm_90"
    ptx_version: tuple[int, int] = (7, 8)
    # The code generator that writes the PTX: "llvm" (NVPTX) or "nvvm" (libNVVM, see
    # nvvm.py); None: TENSORWASM_PTX_BACKEND's choice ("auto": AUTO_BACKEND's, per arch).
    codegen: str | None = None

    triple = NVPTX_TRIPLE
    data_layout = NVPTX_DATA_LAYOUT
    is_gpu = True
    strict_alignment = True
    # Linear memory is device memory: in the global space, loads and stores are ld.global
    # and st.global rather than generic accesses that test the space at run time.
    memory_address_space = 1

    def __post_init__(self) -> None:
        if self.arch not in ARCHES:
            raise CompileError(f"unknown target {self.arch!r}: choose one of {', '.join(ARCHES)}")
        if self.ptx_version < ARCH_PTX[self.arch]:
            want = ".".join(map(str, ARCH_PTX[self.arch]))
            raise CompileError(f"{self.arch} needs PTX ISA {want} or newer")
        if self.codegen not in (None, *CODEGENS):
            raise CompileError(f"unknown PTX code generator {self.codegen!r}: choose {' or '.join(CODEGENS)}")

    @property
    def backend(self) -> str:
        """The code generator this target uses: its own choice, else the environment's."""
        if self.codegen is not None:
            return self.codegen
        from tensorwasm.support import config

        chosen = config.ptx_backend()
        if chosen == "auto":
            return AUTO_BACKEND[self.arch]
        return chosen

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.arch

    @property
    def ptx_isa(self) -> str:
        return f"{self.ptx_version[0]}.{self.ptx_version[1]}"

    def native_min_max(self, ty: ir.Type) -> bool:
        # PTX has min.NaN/max.NaN for f32 from sm_80; nothing for f64, nothing on sm_75.
        return self.arch >= "sm_80" and isinstance(ty, ir.FloatType)

    def mark_entry(self, fn: ir.Function) -> None:
        fn.calling_convention = "ptx_kernel"

    def opaque_bit_op(self, b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value) -> ir.Value:
        # Inline PTX: LLVM cannot see through it to form fabs/fneg, which PTX implements
        # with abs.f64/neg.f64 that do not keep a NaN's sign bit.
        width = x.type.width
        reg = "l" if width == 64 else "r"
        return pure_asm(b, x.type, f"{op}.b{width} $0, $1, $2;", f"={reg},{reg},{reg}", [x, y])

    def float_bits(self, b: ir.IRBuilder, value: ir.Value, int_type: ir.IntType) -> ir.Value:
        # A register written by a float instruction and stored with st.b8 is converted to an
        # integer by the PTX JIT (140.02 is stored as the byte 140): move it through an
        # integer register first, in inline PTX that LLVM cannot fold away.
        width = int_type.width
        return pure_asm(b, int_type, f"mov.b{width} $0, $1;", "=r,f" if width == 32 else "=l,d", [value])

    def opaque(self, b: ir.IRBuilder, value: ir.Value) -> ir.Value:
        width = value.type.width
        reg = "l" if width == 64 else "r"
        return pure_asm(b, value.type, f"mov.b{width} $0, $1;", f"={reg},{reg}", [value])

    def thread_index(self, fl, name: str, dim: str) -> ir.Value:
        register = {"gpu.thread_id": "tid", "gpu.block_id": "ctaid", "gpu.block_dim": "ntid",
                    "gpu.grid_dim": "nctaid"}[name]  # fmt: skip
        intrinsic = f"llvm.nvvm.read.ptx.sreg.{register}.{dim}"
        fn = fl.module.globals.get(intrinsic)
        if fn is None:
            fn = ir.Function(fl.module, ir.FunctionType(ir.IntType(32), []), name=intrinsic)
        return fl.b.call(fn, [])

    loop_vectorization = False

    @per_thread_machine
    def target_machine(self) -> llvm.TargetMachine:
        with _LOCK:
            llvm.initialize_all_targets()
            llvm.initialize_all_asmprinters()
            target = llvm.Target.from_triple(NVPTX_TRIPLE)
        features = f"+ptx{self.ptx_version[0]}{self.ptx_version[1]}"
        return target.create_target_machine(cpu=self.arch, features=features, opt=3)

    @functools.cache  # noqa: B019
    def unoptimised_machine(self) -> llvm.TargetMachine:
        self.target_machine()  # the targets initialised
        target = llvm.Target.from_triple(NVPTX_TRIPLE)
        features = f"+ptx{self.ptx_version[0]}{self.ptx_version[1]}"
        return target.create_target_machine(cpu=self.arch, features=features, opt=0)

    def emit_ptx(self, llvm_ir: str) -> str:
        """Optimise and generate PTX text; checked to be ASCII and of the requested version."""
        if self.backend == "nvvm":
            from tensorwasm.compiler.target import nvvm

            return nvvm.emit_ptx(self, llvm_ir)
        module = self.parse(llvm_ir)
        self.optimize(module)
        ptx = self.codegen_machine(module).emit_assembly(module)
        if not ptx.isascii():
            raise CompileError("generated PTX is not ASCII")
        if f".version {self.ptx_isa}" not in ptx or f".target {self.arch}" not in ptx:
            raise CompileError(f"generated PTX does not declare .version {self.ptx_isa} / {self.arch}")
        return ptx


def nvptx_for_device(capability: tuple[int, int], driver_version: int | None = None) -> NVPTXTarget:
    """The target for a device: architecture by capability, PTX ISA within the driver's reach."""
    arch = arch_for_capability(capability)
    ptx = ARCH_PTX[arch]
    if driver_version is not None:
        limit = driver_ptx_limit(driver_version)
        if limit < ptx:
            major, minor = divmod(driver_version // 10, 100)
            raise CompileError(
                f"the CUDA driver ({major}.{minor}) accepts PTX ISA up to {limit[0]}.{limit[1]}, "
                f"but {arch} needs {ptx[0]}.{ptx[1]}: update the driver"
            )
    return NVPTXTarget(arch, ptx)


def parse_target(name: str) -> NVPTXTarget | HostTarget:
    """A target from its name: ``sm_75``, ``sm_80``, ``sm_90`` or ``host``."""
    if name == "host":
        return HostTarget()
    return NVPTXTarget(name, ARCH_PTX.get(name, (7, 8)))


@record(frozen=True)
class HostTarget(Target):
    name = "host"
    is_gpu = False

    @property
    def triple(self) -> str:  # type: ignore[override]
        return llvm.get_process_triple()

    @property
    def data_layout(self) -> str:  # type: ignore[override]
        return str(self.target_machine().target_data)

    @per_thread_machine
    def target_machine(self) -> llvm.TargetMachine:
        return self._new_target_machine()

    @functools.cache  # noqa: B019
    def unoptimised_machine(self) -> llvm.TargetMachine:
        return self._new_target_machine(opt=0)

    def _new_target_machine(self, opt: int = 2) -> llvm.TargetMachine:
        target, cpu, features = _host_target()
        return target.create_target_machine(cpu=cpu, features=features, opt=opt, jit=True)

    def shared_library(self, module: llvm.ModuleRef) -> bytes | None:
        """``module`` (compiled by :meth:`jit`: optimised) as a shared library, its code made
        again position-independent, or None where this machine cannot link one
        (:mod:`compiler.target.shared`)."""
        from tensorwasm.compiler.target.shared import link_shared

        target, cpu, features = _host_target()
        optnone = self.codegen_machine(module) is not self.target_machine()
        machine = target.create_target_machine(cpu=cpu, features=features, opt=0 if optnone else 2,
                                               reloc="pic", codemodel="default")  # fmt: skip
        return link_shared(module, machine)

    def jit(self, llvm_ir: str | None, obj: bytes | None = None) -> HostCode:
        """Native code from LLVM IR, or from the object code of an earlier compilation."""
        if obj is not None:
            module = llvm.parse_assembly("", context=thread_context())
            module.triple = self.triple
            engine = llvm.create_mcjit_compiler(module, self._new_target_machine())
            engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            engine.finalize_object()
            return HostCode(engine, module, obj)
        module = self.parse(llvm_ir)
        self.optimize(module)
        # Object code for the cache, by the shared machine: the settings the engine uses.
        obj = self.codegen_machine(module).emit_object(module)
        # The engine takes ownership of its target machine: give it one of its own.
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly("", context=thread_context()),
                                            self._new_target_machine())  # fmt: skip
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        return HostCode(engine, module, obj)


@functools.cache
def _host_target() -> tuple[llvm.Target, str, str]:
    """The native target, the host CPU's name and its features, as LLVM names them: asked
    once per process (reading the features costs as much as making a machine)."""
    with _LOCK:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_default_triple()
    return target, llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


# What a processor reports to the operating system that LLVM's host CPU name and features
# derive from (x86: cpuid's family, model and stepping, and its flags; Arm: the ID registers).
_CPUINFO_FIELDS = frozenset({
    "vendor_id", "cpu family", "model", "model name", "stepping", "flags",
    "CPU implementer", "CPU architecture", "CPU variant", "CPU part", "CPU revision", "Features",
})  # fmt: skip


def describe(target: Target) -> str:
    """Everything about a target that changes the code made for it, for cache keys. The
    host is named by what its processor reports to the operating system, read without
    loading LLVM (a warm start never loads it); LLVM is asked where that cannot be read."""
    if target.is_gpu:
        if target.backend == "nvvm":
            from tensorwasm.compiler.target import nvvm

            return f"{target.arch} ptx{target.ptx_isa} {nvvm.version()}"
        return f"{target.arch} ptx{target.ptx_isa}"
    return f"host {sys.platform} {platform.machine()} {_host_signature()}"


@functools.cache
def _host_signature() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            signature = cpuinfo_signature(f.read())
    except OSError:
        signature = None
    if signature is None:
        _, cpu, features = _host_target()
        return f"llvm {cpu} {features}"
    return signature


def cpuinfo_signature(text: str) -> str | None:
    """A hash of the processors' identities and features in ``/proc/cpuinfo`` text (each
    kind once: cores of several kinds all count; not their clocks or load), or None where
    it names none."""
    kinds = set()
    for block in text.split("\n\n"):
        fields = tuple(sorted(
            (key.strip(), value.strip())
            for key, _, value in (line.partition(":") for line in block.splitlines())
            if key.strip() in _CPUINFO_FIELDS
        ))  # fmt: skip
        if fields:
            kinds.add(fields)
    if not kinds:
        return None
    return "cpuinfo " + sha256(repr(sorted(kinds)).encode()).hexdigest()[:32]


class HostEngine:
    """One MCJIT engine that loads the object code of several compile units whose global
    symbols differ (one module's loop kernels: each exports its own entry). Loading a
    unit then costs its relocation alone, not a target machine and an engine of its own."""

    def __init__(self) -> None:
        self._engine: llvm.ExecutionEngine | None = None
        self._loaded: dict[str, HostCode] = {}  # unit name -> its code
        self._lock = threading.Lock()

    def load(self, name: str, obj: bytes) -> HostCode:
        """The unit ``name``'s object code loaded (once: again, the same code)."""
        with self._lock:
            found = self._loaded.get(name)
            if found is not None:
                return found
            if self._engine is None:
                host = HostTarget()
                module = llvm.parse_assembly("", context=thread_context())
                module.triple = host.triple
                self._engine = llvm.create_mcjit_compiler(module, host._new_target_machine())
            self._engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
            self._engine.finalize_object()
            code = self._loaded[name] = HostCode(self._engine, None, obj)
            return code


class HostCode:
    """Native code of one module, kept alive as long as its functions may be called."""

    def __init__(self, engine: llvm.ExecutionEngine, module: llvm.ModuleRef | None, obj: bytes):
        self.engine = engine
        self.module = module
        self.object = obj

    def address(self, name: str) -> int:
        address = self.engine.get_function_address(name)
        if not address:
            raise CompileError(f"no function {name} in the compiled module")
        return address


def find_ptxas() -> str | None:
    """ptxas from PATH, or from the pip package nvidia-cuda-nvcc."""
    import shutil
    from importlib.util import find_spec
    from pathlib import Path

    found = shutil.which("ptxas")
    if found:
        return found
    spec = find_spec("nvidia")
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        for candidate in Path(root).glob("*/bin/ptxas"):
            return str(candidate)
    return None
