"""libNVVM, NVIDIA's own optimiser, as a second PTX code generator beside LLVM's NVPTX backend.

It takes the same LLVM module the lowering writes for an NVPTX target and compiles it with
exact-math options only (:data:`EXACT_MATH`: no contraction into fused multiply-adds, IEEE
division and square root, subnormals kept), at ``-opt=3``, for ``compute_75/80/90``.

libNVVM reads LLVM IR of its own dialect: for these architectures LLVM 7.0.1's (typed
pointers, its attribute and intrinsic names, a fixed datalayout, kernels named in
``!nvvm.annotations``), while llvmlite writes today's LLVM. :func:`to_nvvm_ir` adapts the
text in this one place. LLVM parses and prints the module first, so every line comes in
its canonical form, with every operand's type written out. Each pointer value becomes an
``i8*`` of its address space; an instruction that reads through a pointer (load, store,
getelementptr, atomics, an indirect call) bitcasts it to the pointer type it needs, and a
global's or function's address is cast to ``i8*`` where it is used. Attributes and flags
LLVM 7 does not know are dropped (all are hints), and the few intrinsics that were renamed
since are renamed back (:data:`_RENAMED`). Anything else LLVM 7 lacks is refused by name
(:class:`NVVMUnsupported`), never passed on to be guessed at.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import TYPE_CHECKING

from tensorwasm.compiler.errors import CompileError
from tensorwasm.compiler.target import AUTO_BACKEND, NVPTX_TRIPLE  # noqa: F401 (AUTO_BACKEND: its table, kept there)
from tensorwasm.support import config, logs

if TYPE_CHECKING:
    from tensorwasm.compiler.target import NVPTXTarget

log = logs.get_logger(__name__)

LIBRARY = "libNVVM"
#: The options that keep Wasm's float semantics: no FMA contraction, correctly rounded
#: division and square root, no flush of subnormals to zero.
EXACT_MATH = ("-fma=0", "-prec-div=1", "-prec-sqrt=1", "-ftz=0")
OPTIMISE = "-opt=3"
#: The NVVM IR version these modules declare (NVVM IR 2.0: LLVM 7.0.1's dialect).
NVVM_IR_VERSION = (2, 0)
NVVM_DATA_LAYOUT = (
    "e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-i128:128:128-f32:32:32-f64:64:64"
    "-v16:16:16-v32:32:32-v64:64:64-v128:128:128-n16:32:64"
)

_LOCK = threading.Lock()


class NVVMError(CompileError):
    """libNVVM is missing, or refused a module (its log is in the message)."""


class NVVMUnsupported(NVVMError):
    """The module uses something libNVVM's LLVM 7 dialect lacks (named in the message)."""


def options(target: NVPTXTarget) -> list[str]:
    """libNVVM's options for ``target``: its virtual architecture, -opt=3, exact math."""
    return [f"-arch=compute_{target.arch.removeprefix('sm_')}", OPTIMISE, *EXACT_MATH]


def emit_ptx(target: NVPTXTarget, llvm_ir: str) -> str:
    """PTX for ``target`` from the lowering's LLVM IR, by libNVVM; checked to be ASCII and
    for the target's architecture, with a PTX ISA no older than the target's."""
    text = to_nvvm_ir(llvm_ir)
    ptx = _compile(text, options(target))
    if not ptx.isascii():
        raise NVVMError("libNVVM's PTX is not ASCII")
    version = re.search(r"^\.version (\d+)\.(\d+)", ptx, re.MULTILINE)
    if version is None or f".target {target.arch}" not in ptx:
        raise NVVMError(f"libNVVM's PTX does not declare a .version and .target {target.arch}")
    # The module is whole: an external function in the PTX is an intrinsic libNVVM did not
    # know, which it leaves as a call for the linker, where there is none.
    unknown = re.findall(r"^\.extern \.func[^\n]*?([\w.$]+)\s*$", ptx, re.MULTILINE)
    if unknown:
        raise NVVMUnsupported(f"{LIBRARY} does not know the intrinsic {', '.join(unknown)}")
    written = (int(version[1]), int(version[2]))
    if written < target.ptx_version:
        raise NVVMError(f"{LIBRARY} wrote PTX ISA {written[0]}.{written[1]}, older than {target.ptx_isa}")
    # libNVVM declares its own release's PTX ISA (9.5 from CUDA 13.5), which older drivers
    # refuse; the code it writes for these architectures is older PTX. Declare the target's
    # ISA, as LLVM's PTX does: ptxas checks every instruction against the declared version,
    # so anything newer is an assembler error naming the feature, never a different program.
    log.debug("libNVVM wrote PTX ISA %d.%d for %s; declared %s", *written, target.arch, target.ptx_isa)
    return ptx[: version.start()] + f".version {target.ptx_isa}" + ptx[version.end() :]


@functools.cache
def _bindings():
    """cuda-python's libNVVM binding, its library found by cuda.pathfinder (the pip package
    nvidia-nvvm, then the CUDA toolkit); an error naming libNVVM where either is missing."""
    try:
        from cuda.bindings import nvvm
    except ImportError as exc:
        raise NVVMError(f"{LIBRARY} needs cuda-python's bindings (pip install cuda-bindings): {exc}") from exc
    try:
        nvvm.version()
    except Exception as exc:  # the loader raises its own types; all mean "not found"
        raise NVVMError(
            f"{LIBRARY} (libnvvm.so) was not found: install the pip package nvidia-nvvm or a CUDA "
            f"toolkit, or choose the LLVM code generator ({config.PTX_BACKEND}=llvm): {exc}"
        ) from exc
    return nvvm


@functools.cache
def version() -> str:
    """What names the libNVVM in use, for cache keys: its API and NVVM IR versions, and the
    library file's name and size (a CUDA release changes the code but not those versions)."""
    import os

    nvvm = _bindings()
    major, minor = nvvm.version()
    ir_major, ir_minor, _, _ = nvvm.ir_version()
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        path = load_nvidia_dynamic_lib("nvvm").abs_path
        build = f"{os.path.basename(path)} {os.stat(path).st_size}"
    except (ImportError, OSError, RuntimeError):
        build = "unknown build"
    return f"nvvm {major}.{minor} ir {ir_major}.{ir_minor} {build}"


def _compile(text: str, opts: list[str]) -> str:
    nvvm = _bindings()
    data = text.encode()
    with _LOCK:  # one program at a time: the binding's handles are not ours to share
        program = nvvm.create_program()
        try:
            nvvm.add_module_to_program(program, data, len(data), "tensorwasm")
            try:
                nvvm.compile_program(program, len(opts), [o.encode() for o in opts])
            except nvvm.nvvmError as exc:
                raise NVVMError(f"{LIBRARY} refused the module ({exc}): {_log(nvvm, program)}") from exc
            size = nvvm.get_compiled_result_size(program)
            out = bytearray(size)
            nvvm.get_compiled_result(program, out)
        finally:
            nvvm.destroy_program(program)
    return bytes(out).rstrip(b"\0").decode("ascii", errors="replace")


def _log(nvvm, program) -> str:
    size = nvvm.get_program_log_size(program)
    out = bytearray(size)
    nvvm.get_program_log(program, out)
    return bytes(out).rstrip(b"\0").decode(errors="replace").strip()


# -- the dialect -----------------------------------------------------------------------


def to_nvvm_ir(llvm_ir: str) -> str:
    """The module in libNVVM's dialect (LLVM 7.0.1, NVVM IR 2.0): see the module docstring."""
    from tensorwasm.compiler.target import llvm, thread_context

    try:
        module = llvm.parse_assembly(llvm_ir, context=thread_context())
    except RuntimeError as exc:
        raise CompileError(f"LLVM rejected the generated IR: {exc}") from exc
    return _Downgrade(_expand_splats(str(module))).run()


_SPLAT = re.compile(r"splat \((\w+) ([^()]+)\)")


def _expand_splats(text: str) -> str:
    """Vector constants as LLVM 7 writes them: today's ``splat (i64 -1)`` is ``<i64 -1, i64
    -1>``, its lane count that of the nearest vector type of the lane type before it."""

    def expand(line: str) -> str:
        def one(m: re.Match) -> str:
            counts = re.findall(rf"<(\d+) x {re.escape(m[1])}>", line[: m.start()])
            if not counts:
                raise CompileError(f"libNVVM: no vector type for {m[0]!r} in: {line.strip()}")
            return "<" + ", ".join([f"{m[1]} {m[2]}"] * int(counts[-1])) + ">"

        return _SPLAT.sub(one, line)

    return "\n".join(expand(line) if "splat (" in line else line for line in text.split("\n"))


# Intrinsics renamed since LLVM 7 -> the LLVM 7 name (same semantics, same operands).
# roundeven is rint under the default rounding mode, the only one PTX code runs in.
_RENAMED = {
    "llvm.stacksave.p0": "llvm.stacksave",
    "llvm.stackrestore.p0": "llvm.stackrestore",
    "llvm.nvvm.barrier.cta.sync.all": "llvm.nvvm.barrier.sync",
    "llvm.roundeven.f32": "llvm.rint.f32",
    "llvm.roundeven.f64": "llvm.rint.f64",
}
# Intrinsics that LLVM 7 lacks and PTX has as one instruction: the instruction LLVM's
# NVPTX backend selects for them (min.NaN/max.NaN: sm_80+, which alone asks for them).
_AS_PTX = {
    "llvm.minimum.f32": '"min.NaN.f32 $0, $1, $2;", "=f,f,f"',
    "llvm.maximum.f32": '"max.NaN.f32 $0, $1, $2;", "=f,f,f"',
}
# Intrinsic families LLVM 7 and libNVVM know under today's names and mangling.
_KNOWN_INTRINSICS = re.compile(
    r"llvm\.(nvvm\.|sqrt\.|fabs\.|copysign\.|floor\.|ceil\.|trunc\.|rint\.|nearbyint\.|round\.|"
    r"minnum\.|maxnum\.|ctpop\.|ctlz\.|cttz\.|fshl\.|fshr\.|bswap\.|bitreverse\.|memcpy\.|"
    r"memmove\.|memset\.|[su](add|sub|mul)\.with\.overflow\.|lifetime\.|assume$|expect\.|"
    r"trap$|stacksave$|stackrestore$)"
)
# Attributes and flags that LLVM 7 does not know; all are hints, safe to drop.
_DROPPED_ATTRS = re.compile(
    r"\b(noundef|nocallback|nofree|nosync|willreturn|mustprogress|immarg|writable|"
    r"dead_on_unwind|memory\([^)]*\)|range\([^)]*\)|nofpclass\([^)]*\)|captures\([^)]*\)|"
    r"initializes\([^)]*\)|dead_on_return|nocreateundeforpoison)\s*"
)
# The function attributes LLVM 7 knows that matter to code generation (groups keep these).
_KNOWN_FN_ATTRS = frozenset({
    "nounwind", "readnone", "readonly", "writeonly", "argmemonly", "inaccessiblememonly",
    "convergent", "speculatable", "noinline", "alwaysinline", "norecurse", "noreturn", "cold",
})  # fmt: skip
_MEMORY_ATTRS = {
    "memory(none)": "readnone",
    "memory(read)": "readonly",
    "memory(argmem: readwrite)": "argmemonly",
    "memory(inaccessiblemem: readwrite)": "inaccessiblememonly",
}
# Flags added to these instructions since LLVM 7 (hints: dropped).
_NEW_FLAGS = {"or", "zext", "uitofp", "icmp", "trunc"}
_NEW_FLAG_WORDS = re.compile(r"^((disjoint|nneg|samesign|nuw|nsw)\s+)+")
# Words before a function's return type.
_LINKAGE = re.compile(
    r"^((internal|private|external|dso_local|hidden|protected|linkonce_odr|weak_odr|weak|"
    r"ptx_kernel|fastcc|ccc|noalias|nonnull|zeroext|signext|inreg|align \d+|dereferenceable\(\d+\))\s+)*"
)
# Instructions LLVM 7 has not got.
_UNSUPPORTED_OPCODES = frozenset({"fneg", "freeze", "callbr"})

_PTR = re.compile(r'(?<![\w%@."$-])ptr(?: addrspace\((\d+)\))?(?![\w.$])')
_NAME = r'(?:[-\w.$]+|"[^"]*")'
_INSTRUCTION = re.compile(rf"^(\s+)(?:(%{_NAME}) = )?((?:tail |musttail |notail )?\w+)(?: (.*))?$")
_SYMBOL_DEF = re.compile(rf"^@({_NAME}) = (.*?)\b(global|constant) (.*)$")
_FUNCTION = re.compile(rf"^(define|declare) (.*?)@({_NAME})\((.*)\)(.*?)( \{{)?$")


def _ptr7(match: re.Match) -> str:
    space = match.group(1)
    return f"i8 addrspace({space})*" if space and space != "0" else "i8*"


def _type7(text: str) -> str:
    """Today's type (or any text holding types) with LLVM 7's pointer types."""
    return _PTR.sub(_ptr7, text)


def _pointee(pointer7: str, element7: str) -> str:
    """The pointer to ``element7`` in the address space of ``pointer7`` (an ``i8*`` type)."""
    return pointer7.replace("i8", element7, 1) if pointer7.startswith("i8 ") else f"{element7}*"


def _split(text: str) -> list[str]:
    """``text`` split at its commas outside brackets and strings."""
    parts, depth, start, quoted = [], 0, 0, False
    for i, c in enumerate(text):
        if c == '"':
            quoted = not quoted
        elif quoted:
            continue
        elif c in "([{<":
            depth += 1
        elif c in ")]}>":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return [p for p in parts if p]


_SCALAR = re.compile(
    r"ptr addrspace\(\d+\)|ptr|i\d+|half|bfloat|float|double|fp128|void|metadata|label|token"
)


def _type_end(text: str, i: int = 0) -> int:
    """Where the type (today's) that starts ``text`` at ``i`` ends."""
    if text[i] in "<[{":
        depth = 0
        for j in range(i, len(text)):
            depth += text[j] in "<[{("
            depth -= text[j] in ">]})"
            if depth == 0:
                return j + 1
    match = _SCALAR.match(text, i)
    if match is None:
        raise NVVMUnsupported(f"{LIBRARY}: a type LLVM 7 cannot read at {text[i : i + 30]!r}")
    return match.end()


def _element(type22: str, indices: list[str]) -> str:
    """The type a getelementptr's further ``indices`` select inside ``type22``."""
    for index in indices:
        inner = type22[1:-1].strip()
        if type22.startswith("{") or type22.startswith("<{"):
            fields = _split(inner.strip("{}").strip())
            type22 = fields[int(index.split()[-1])]
        else:  # [N x T] or <N x T>
            type22 = inner.split(" x ", 1)[1].strip()
    return type22


def _intrinsic7(name: str) -> str:
    """An intrinsic's LLVM 7 name (pointer overloads were ``p1i8``, now ``p1``); an error
    naming it where LLVM 7 has none."""
    if name in _RENAMED:
        return _RENAMED[name]
    if name in _AS_PTX:
        return name
    if not _KNOWN_INTRINSICS.match(name):
        raise NVVMUnsupported(f"{LIBRARY}'s LLVM 7 dialect has no intrinsic {name}")
    return re.sub(r"\.p(\d+)(?=\.|$)", r".p\1i8", name)


_BYVAL = re.compile(rf"^ptr byval\((.*)\)((?: \w+(?: \d+)?)*) (%{_NAME})$")


def _param7(param: str) -> tuple[str, str, str | None]:
    """A parameter (today's) in LLVM 7's dialect, its type there, and the instruction that
    makes its value where it is a ``byval`` one: LLVM 7 writes ``[N x i64]* byval``, not
    ``ptr byval([N x i64])``, and the body, which reads every pointer as an ``i8*``, gets the
    parameter cast to one under its own name."""
    m = _BYVAL.match(param.strip())
    if m is None:
        return _type7(param), _type7(param[: _type_end(param)]) if param != "..." else "", None
    pointer = f"{_type7(m[1])}*"
    name = m[3]
    held = f'{name[:-1]}.byval"' if name.endswith('"') else f"{name}.byval"
    return f"{pointer} byval{m[2]} {held}", pointer, f"{name} = bitcast {pointer} {held} to i8*"


def _return_type(head: str) -> str:
    """The LLVM 7 return type at the end of a call's or a function's head."""
    head = _LINKAGE.sub("", _DROPPED_ATTRS.sub("", head).strip())
    return _type7(head[: _type_end(head)]) if head else "void"


class _Downgrade:
    """One module's text, rewritten line by line into libNVVM's dialect."""

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.out: list[str] = []
        self.symbols: dict[str, str] = {}  # @name -> its LLVM 7 pointer type
        self.kernels: list[str] = []  # kernels by name
        self.attributes: dict[str, str] = {}  # #N -> its attributes LLVM 7 knows
        self.counter = 0
        self.metadata = 0  # the first free metadata number
        self.declarations: dict[str, str] = {}  # intrinsics the rewrite itself calls
        self.entry: list[str] = []  # instructions the next function body starts with
        self.handlers = {
            "load": self._load, "store": self._store, "getelementptr": self._getelementptr,
            "alloca": self._alloca, "atomicrmw": self._atomicrmw, "cmpxchg": self._cmpxchg,
            "call": self._call,
        }  # fmt: skip

    def run(self) -> str:
        self._scan()
        self.out.append(f'target datalayout = "{NVVM_DATA_LAYOUT}"')
        self.out.append(f'target triple = "{NVPTX_TRIPLE}"')
        for line in self.lines:
            self._line(line)
        self.out.extend(self.declarations.values())
        self._annotate()
        return "\n".join(self.out) + "\n"

    # -- module level

    def _scan(self) -> None:
        """Every global's and function's type, the attribute groups and metadata numbers."""
        for line in self.lines:
            if m := _SYMBOL_DEF.match(line):
                space = re.search(r"addrspace\((\d+)\)", m[2])
                value_type = _type7(m[4][: _type_end(m[4])])
                self.symbols[m[1]] = f"{value_type} addrspace({space[1]})*" if space else f"{value_type}*"
            elif m := _FUNCTION.match(line):
                params = [_param7(p)[1] for p in _split(m[4]) if p != "..."]
                self.symbols[m[3]] = f"{_return_type(m[2])} ({', '.join(params)})*"
            elif m := re.match(r"^attributes (#\d+) = \{ (.*) \}$", line):
                kept = [_MEMORY_ATTRS.get(a, a) for a in re.findall(r"memory\([^)]*\)|\S+", m[2])]
                self.attributes[m[1]] = " ".join(a for a in kept if a in _KNOWN_FN_ATTRS)
            elif m := re.match(r"^!(\d+) = ", line):
                self.metadata = max(self.metadata, int(m[1]) + 1)

    def _line(self, line: str) -> None:
        if line.startswith((";", "target datalayout", "target triple")) or not line.strip():
            return
        elif line.startswith("attributes #"):
            name = line.split()[1]
            if self.attributes[name]:
                self.out.append(f"attributes {name} = {{ {self.attributes[name]} }}")
        elif line.startswith(("define ", "declare ")):
            self._function(line)
        elif line.startswith("@"):
            self.out.append(self._operands7(line))
        elif m := _INSTRUCTION.match(line):
            if self.entry:  # the function's first instruction: its byval parameters as i8*s first
                self.out.extend(f"{m[1]}{line}" for line in self.entry)
                self.entry.clear()
            self._instruction(m[1], m[2], m[3], m[4] or "")
        else:
            self.out.append(line)

    def _function(self, line: str) -> None:
        m = _FUNCTION.match(line)
        name = m[3]
        if name.startswith("llvm."):
            if name in _AS_PTX:
                return
            name = _intrinsic7(name)
        head = _DROPPED_ATTRS.sub("", m[2])
        if "ptx_kernel" in head:
            head = head.replace("ptx_kernel ", "")
            self.kernels.append(name)
        params = []
        for p in _split(m[4]):
            text, _, entry = _param7(p)
            params.append(self._strip_attrs(text))
            self.entry.extend([entry] if entry else [])
        params = ", ".join(params)
        tail = " ".join(a for a in m[5].split() if not a.startswith("#") or self.attributes.get(a))
        self.out.append(f"{m[1]} {_type7(head)}@{name}({params}){' ' + tail if tail else ''}{m[6] or ''}")

    def _annotate(self) -> None:
        first = self.metadata
        nodes = [f"!{first + i}" for i in range(len(self.kernels) + 1)]
        self.out.append(f"!nvvmir.version = !{{{nodes[0]}}}")
        self.out.append(f"{nodes[0]} = !{{i32 {NVVM_IR_VERSION[0]}, i32 {NVVM_IR_VERSION[1]}}}")
        if self.kernels:
            self.out.append(f"!nvvm.annotations = !{{{', '.join(nodes[1:])}}}")
            for node, name in zip(nodes[1:], self.kernels, strict=True):
                self.out.append(f'{node} = !{{{self.symbols[name]} @{name}, !"kernel", i32 1}}')

    # -- operands

    @staticmethod
    def _strip_attrs(text: str) -> str:
        return _DROPPED_ATTRS.sub("", text.replace("captures(none) ", "nocapture "))

    def _operands7(self, text: str) -> str:
        """``text`` with LLVM 7 types, each pointer to a global or a function as an ``i8*``."""

        def cast(m: re.Match) -> str:
            name = m[3]
            pointer = _ptr7(m)
            if name not in self.symbols or name.startswith("llvm."):
                return f"{pointer} @{name}"
            return f"{pointer} bitcast ({self.symbols[name]} @{name} to {pointer})"

        text = re.sub(rf'(?<![\w%@."$-])ptr(?: addrspace\((\d+)\))?() @({_NAME})(?![\w.$"(])', cast, text)
        return _type7(re.sub(r"\bpoison\b", "undef", text))

    def _typed(self, operand: str) -> tuple[str, str, str]:
        """A ``type value rest`` operand (today's) as its LLVM 7 type, value and what follows."""
        operand = self._strip_attrs(operand.strip())
        end = _type_end(operand)
        type7 = _type7(operand[:end])
        rest = operand[end:].strip()
        value_end = len(rest)
        if re.match(r"\w+ \(", rest):  # a constant expression
            depth = 0
            for j, c in enumerate(rest):
                depth += c == "("
                depth -= c == ")"
                if c == ")" and depth == 0:
                    value_end = j + 1
                    break
        elif rest.startswith("<"):  # a vector constant: up to its closing bracket
            depth = 0
            for j, c in enumerate(rest):
                depth += c == "<"
                depth -= c == ">"
                if depth == 0:
                    value_end = j + 1
                    break
        elif " " in rest:
            value_end = rest.index(" ")
        value7 = self._operands7(f"{operand[:end]} {rest[:value_end]}")[len(type7) + 1 :]
        return type7, value7, rest[value_end:]

    def _fresh(self) -> str:
        self.counter += 1
        return f"%tw.nvvm.{self.counter}"

    def _cast(self, indent: str, pointer: str, element7: str) -> tuple[str, str]:
        """The ``type value`` pointer operand (today's) as a pointer to ``element7``: its
        type and value, through a bitcast where ``element7`` is not ``i8``."""
        type7, value, _ = self._typed(pointer)
        if element7 == "i8":
            return type7, value
        target = _pointee(type7, element7)
        name = self._fresh()
        self.out.append(f"{indent}{name} = bitcast {type7} {value} to {target}")
        return target, name

    # -- instructions

    def _instruction(self, indent: str, result: str | None, opcode: str, rest: str) -> None:
        if opcode in _UNSUPPORTED_OPCODES:
            raise NVVMUnsupported(
                f"{LIBRARY}'s LLVM 7 dialect has no {opcode} instruction: {rest.strip()[:60]}"
            )
        if opcode in _NEW_FLAGS:
            rest = _NEW_FLAG_WORDS.sub("", rest)
        assign = f"{result} = " if result else ""
        handler = self.handlers.get(opcode.split()[-1])
        if handler is None:
            self.out.append(f"{indent}{assign}{opcode} {self._operands7(rest)}".rstrip())
        else:
            handler(indent, assign, opcode, rest)

    def _load(self, indent: str, assign: str, opcode: str, rest: str) -> None:
        parts = _split(rest)
        head = parts[0].split(" ")
        prefix = "".join(f"{w} " for w in head if w in ("atomic", "volatile"))
        element7 = _type7(" ".join(w for w in head if w not in ("atomic", "volatile")))
        _, _, tail = self._typed(parts[1])
        pointer, address = self._cast(indent, parts[1], element7)
        others = "".join(f", {p}" for p in parts[2:])
        self.out.append(f"{indent}{assign}load {prefix}{element7}, {pointer} {address}{tail}{others}")

    def _store(self, indent: str, assign: str, opcode: str, rest: str) -> None:
        parts = _split(rest)
        head = parts[0].split(" ")
        prefix = "".join(f"{w} " for w in head if w in ("atomic", "volatile"))
        element7, value, _ = self._typed(" ".join(w for w in head if w not in ("atomic", "volatile")))
        _, _, tail = self._typed(parts[1])
        pointer, address = self._cast(indent, parts[1], element7)
        others = "".join(f", {p}" for p in parts[2:])
        self.out.append(f"{indent}store {prefix}{element7} {value}, {pointer} {address}{tail}{others}")

    def _getelementptr(self, indent: str, assign: str, opcode: str, rest: str) -> None:
        parts = _split(rest)
        flags = re.match(r"^((?:inbounds|nuw|nusw|inrange\([^)]*\))\s+)*", parts[0])
        type22 = parts[0][flags.end() :]
        inbounds = "inbounds " if "inbounds" in flags[0] else ""
        element7 = _type7(type22)
        back, _, _ = self._typed(parts[1])
        pointer, address = self._cast(indent, parts[1], element7)
        indices = "".join(f", {self._operands7(p)}" for p in parts[2:])
        selected = _type7(_element(type22, parts[3:]))
        gep = f"getelementptr {inbounds}{element7}, {pointer} {address}{indices}"
        if selected == "i8":
            self.out.append(f"{indent}{assign}{gep}")
            return
        name = self._fresh()
        self.out.append(f"{indent}{name} = {gep}")
        self.out.append(f"{indent}{assign}bitcast {_pointee(back, selected)} {name} to {back}")

    def _alloca(self, indent: str, assign: str, opcode: str, rest: str) -> None:
        parts = _split(rest)
        element7 = _type7(parts[0])
        if element7 == "i8":
            self.out.append(f"{indent}{assign}alloca {self._operands7(rest)}")
            return
        name = self._fresh()
        self.out.append(f"{indent}{name} = alloca {element7}{''.join(', ' + p for p in parts[1:])}")
        self.out.append(f"{indent}{assign}bitcast {element7}* {name} to i8*")

    def _atomicrmw(self, indent: str, assign: str, opcode: str, rest: str) -> None:
        parts = [p for p in _split(rest) if not p.startswith("align ")]  # LLVM 7: no align
        words = parts[0].split(" ")
        at = 1 if words[0] == "volatile" else 0
        element7, value, tail = self._typed(parts[1])
        if (
            words[at] == "fadd"
            and element7 in ("float", "double")
            and tail.split() == ["monotonic"]
            and not at
        ):
            # LLVM 7 has no atomicrmw fadd; NVVM's relaxed atomic add intrinsic is red/atom.add.
            pointer, address = self._cast(indent, " ".join(words[at + 1 :]), element7)
            space = re.search(r"addrspace\((\d+)\)", pointer)
            width = 32 if element7 == "float" else 64
            name = f"llvm.nvvm.atomic.load.add.f{width}.p{space[1] if space else 0}f{width}"
            self.declarations[name] = f"declare {element7} @{name}({pointer}, {element7})"
            self.out.append(
                f"{indent}{assign}call {element7} @{name}({pointer} {address}, {element7} {value})"
            )
            return
        if words[at] not in ("xchg", "add", "sub", "and", "nand", "or", "xor", "max", "min", "umax", "umin"):
            raise NVVMUnsupported(f"{LIBRARY}'s LLVM 7 dialect has no atomicrmw {words[at]}")
        pointer, address = self._cast(indent, " ".join(words[at + 1 :]), element7)
        op = " ".join(words[: at + 1])
        self.out.append(f"{indent}{assign}atomicrmw {op} {pointer} {address}, {element7} {value}{tail}")

    def _cmpxchg(self, indent: str, assign: str, opcode: str, rest: str) -> None:
        parts = [p for p in _split(rest) if not p.startswith("align ")]
        words = parts[0].split(" ")
        flags = "".join(f"{w} " for w in words if w in ("weak", "volatile"))
        element7, expected, _ = self._typed(parts[1])
        _, new, tail = self._typed(parts[2])
        pointer, address = self._cast(
            indent, " ".join(w for w in words if w not in ("weak", "volatile")), element7
        )
        self.out.append(
            f"{indent}{assign}cmpxchg {flags}{pointer} {address}, {element7} {expected}, {element7} {new}{tail}"
        )

    def _call(self, indent: str, assign: str, opcode: str, rest: str) -> None:
        callee = re.search(
            rf'(asm (?:sideeffect )?(?:alignstack )?"(?:[^"\\]|\\.)*", "[^"]*"|@{_NAME}|%{_NAME})\(', rest
        )
        if callee is None:
            raise NVVMUnsupported(f"{LIBRARY}: a call LLVM 7 cannot read: {rest[:60]}")
        head = rest[: callee.start()].strip()
        depth, end = 0, len(rest)
        for j in range(callee.end() - 1, len(rest)):
            depth += rest[j] == "("
            depth -= rest[j] == ")"
            if depth == 0:
                end = j
                break
        args22 = [self._strip_attrs(a) for a in _split(rest[callee.end() : end])]
        args = [self._operands7(a) for a in args22]
        tail = " ".join(w for w in rest[end + 1 :].split() if not w.startswith("#") or self.attributes.get(w))
        ret7 = _return_type(head)
        target = callee[1]
        if target.startswith("@llvm."):
            name = target[1:]
            if name in _AS_PTX:
                target, tail = f"asm {_AS_PTX[name]}", "nounwind readnone"
            else:
                target = "@" + _intrinsic7(name)
        elif target.startswith("%"):
            fn_type = f"{ret7} ({', '.join(_type7(a[: _type_end(a)]) for a in args22)})*"
            name = self._fresh()
            self.out.append(f"{indent}{name} = bitcast i8* {target} to {fn_type}")
            target = name
        prefix = opcode.removesuffix("call")
        self.out.append(
            f"{indent}{assign}{prefix}call {ret7} {target}({', '.join(args)}){' ' + tail if tail else ''}"
        )
