"""Errors of the compiler: bad input, unsupported features, failed stages.

Each carries what a user needs to find the cause: the byte offset in the module and,
inside the code section, the function index. ``str()`` of any of them is the one line
the CLI prints.
"""

from __future__ import annotations

from tensorwasm.support.errors import TensorWasmError


class DecodeError(TensorWasmError):
    """The bytes are not a well-formed Wasm module."""

    def __init__(self, message: str, offset: int | None = None, func_index: int | None = None):
        self.reason = message
        self.offset = offset
        self.func_index = func_index
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.func_index is not None:
            where.append(f"function {self.func_index}")
        if self.offset is not None:
            where.append(f"offset 0x{self.offset:x}")
        return f"{self.reason} (at {', '.join(where)})" if where else self.reason


class UnsupportedFeature(DecodeError):
    """The module uses a Wasm proposal TensorWasm does not compile.

    ``proposal`` names it ("threads") and ``what`` the use ("instruction return_call"),
    where the decoder knows them: :meth:`uses` is then the short reason a report gives."""

    def __init__(
        self,
        message: str,
        offset: int | None = None,
        func_index: int | None = None,
        *,
        proposal: str | None = None,
        what: str | None = None,
    ):
        self.proposal = proposal
        self.what = what
        super().__init__(message, offset, func_index)

    def uses(self) -> str:
        """The reason in short: "uses the threads proposal (instruction 0xfe 30 at offset 0x4a)", else the message."""
        if self.proposal is None:
            return self._format()
        where = f" at offset 0x{self.offset:x}" if self.offset is not None else ""
        return f"uses the {self.proposal} proposal ({self.what}{where})"


class ValidationError(TensorWasmError):
    """The module is well-formed but not valid (the validator's message is kept)."""


class TranslateError(TensorWasmError):
    """The translator could not turn a function into the dialect (names where)."""


class CompileError(TensorWasmError):
    """A later stage (lowering, code generation) failed; the message names the op."""


class NotCompilable(CompileError):
    """A function cannot run on the chosen backend (it calls a host import, say)."""

    def __init__(self, message: str, import_name: tuple[str, str] | None = None):
        self.import_name = import_name
        super().__init__(message)
