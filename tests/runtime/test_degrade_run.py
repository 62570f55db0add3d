"""Every module wasmtime runs, ``tensorwasm run`` and ``tensorwasm.instantiate`` run, with
wasmtime's output: a function using a proposal the compiler does not translate stays on
wasmtime and its loop is reported declined with the reason, while a loop elsewhere is
still offloaded (host backend). ``inspect``, ``compile`` and ``invoke --backend cpu`` keep
refusing such a module by name and offset."""

from __future__ import annotations

import json

import pytest
import wasmtime

import tensorwasm
from tensorwasm.runtime.cli import main

# $fill's loop is offloadable; $odd (each case's) uses an unsupported proposal in a loop.
TEMPLATE = """(module
  (memory (export "memory") 2)
  {extra}
  (func $fill (param $n i32)
    (local $i i32)
    (loop $l
      (i32.store offset=4096 (i32.shl (local.get $i) (i32.const 2))
        (i32.add (i32.mul (i32.load offset=65536 (i32.shl (local.get $i) (i32.const 2))) (i32.const 3))
                 (local.get $i)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n)))))
  (func $odd (param $n i32) (result i32)
    (local $i i32) (local $s i32)
    {odd})
  (func $plain (param i32) (result i32) (i32.mul (local.get 0) (i32.const 5)))
  (func (export "main") (result i32)
    (local $i i32) (local $s i32)
    (loop $init
      (i32.store offset=65536 (i32.shl (local.get $i) (i32.const 2)) (i32.mul (local.get $i) (i32.const 7)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $init (i32.lt_u (local.get $i) (i32.const 1000))))
    (call $fill (i32.const 1000))
    (local.set $s (call $odd (i32.const 40)))
    (local.set $i (i32.const 0))
    (loop $sum
      (local.set $s (i32.add (i32.mul (local.get $s) (i32.const 31))
                             (i32.load offset=4096 (i32.shl (local.get $i) (i32.const 2)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $sum (i32.lt_u (local.get $i) (i32.const 1000))))
    (local.get $s)))"""

# The counting loop every $odd has, around its proposal's instruction(s).
LOOP = """(loop $l
      {body}
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))"""

CASES = {
    "threads": (
        "",
        LOOP.format(body="(drop (i32.atomic.rmw.add (i32.const 64) (local.get $i)))")
        + " (atomic.fence) (i32.atomic.load (i32.const 64))",
    ),
    "exception handling": (
        "(tag $e (param i32))",
        LOOP.format(
            body="""(local.set $s (i32.add (local.get $s)
               (block $h (result i32)
                 (try_table (catch $e $h) (throw $e (i32.mul (local.get $i) (i32.const 3))))
                 (i32.const -1))))"""
        )
        + " (local.get $s)",
    ),
    "tail calls": (
        "",
        LOOP.format(body="(local.set $s (i32.add (local.get $s) (local.get $i)))")
        + " (return_call $plain (local.get $s))",
    ),
    "multi-memory": (
        '(memory $two 1) (data (memory $two) (i32.const 0) "\\05\\06\\07\\08")',
        LOOP.format(
            body="(local.set $s (i32.add (local.get $s) (i32.load8_u $two (i32.and (local.get $i) (i32.const 3)))))"
        )
        + " (local.get $s)",
    ),
}


def module_text(proposal: str) -> str:
    extra, odd = CASES[proposal]
    return TEMPLATE.format(extra=extra, odd=odd)


def wasmtime_main(data: bytes) -> int:
    store = wasmtime.Store()
    instance = wasmtime.Instance(store, wasmtime.Module(store.engine, data), [])
    return instance.exports(store)["main"](store)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("proposal", sorted(CASES))
def test_run_gives_wasmtimes_output_and_declines_only_the_unsupported_functions_loop(
    proposal: str, device: str, tmp_path, capsys
) -> None:
    path = tmp_path / "m.wat"
    path.write_text(module_text(proposal))
    expected = wasmtime_main(wasmtime.wat2wasm(module_text(proposal)))
    status = main(
        ["run", str(path), "--invoke", "main", "--device", device, "--offload", "always", "--report", "json"]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    assert out.strip() == str(expected)
    report = json.loads(err.strip().splitlines()[-1])
    assert report["unsupported"] is None and report["device"] == device
    rows = {row["func"]: row for row in report["loops"]}
    assert rows["fill"]["verdict"] == "offload" and rows["fill"]["offloaded"] == 1, rows["fill"]
    assert rows["odd"]["verdict"] == "reject" and rows["odd"]["device"] is None
    assert rows["odd"]["reason"].startswith(f"the function uses the {proposal} proposal ("), rows["odd"]
    assert "at offset 0x" in rows["odd"]["reason"]


@pytest.mark.parametrize("proposal", sorted(CASES))
def test_instantiate_runs_it_and_reports_the_declined_loop(proposal: str) -> None:
    data = bytes(wasmtime.wat2wasm(module_text(proposal)))
    store = wasmtime.Store()
    instance = tensorwasm.instantiate(store, data, device="cpu", offload="always")
    assert instance.exports(store)["main"](store) == wasmtime_main(data)
    found = tensorwasm.report(instance)
    (odd,) = [row for row in found.loops if row.func == "odd"]
    assert odd.verdict == "reject" and f"uses the {proposal} proposal" in odd.reason
    assert [row.offloaded for row in found.loops if row.func == "fill"] == [1]


def test_a_loop_calling_into_an_unsupported_function_stays_on_wasmtime(tmp_path, capsys) -> None:
    text = module_text("tail calls").replace(
        "(call $fill (i32.const 1000))",
        "(call $fill (i32.const 1000)) (call $caller (i32.const 3))",
    ).replace(
        "(func $plain",
        """(func $caller (param $n i32)
    (loop $l
      (drop (call $odd (local.get $n)))
      (br_if $l (local.tee $n (i32.sub (local.get $n) (i32.const 1))))))
  (func $plain""",
    )  # fmt: skip
    path = tmp_path / "m.wat"
    path.write_text(text)
    status = main(
        ["run", str(path), "--invoke", "main", "--device", "cpu", "--offload", "always", "--report", "text"]
    )
    out, err = capsys.readouterr()
    assert status == 0 and out.strip() == str(wasmtime_main(wasmtime.wat2wasm(text)))
    assert "caller +0x" in err and "calls odd, which uses the tail calls proposal" in err, err
    assert "fill +0x" in err and "ran 1/1 times on cpu" in err, err


def test_a_module_level_use_runs_it_as_it_is_with_the_reason(tmp_path, capsys) -> None:
    text = module_text("tail calls").replace(
        '(memory (export "memory") 2)', '(memory (export "memory") i64 2)'
    )
    text = text.replace(
        "(i32.shl (local.get $i) (i32.const 2))", "(i64.extend_i32_u (i32.shl (local.get $i) (i32.const 2)))"
    )
    text = text.replace("(i32.const 64)", "(i64.const 64)")
    path = tmp_path / "m.wat"
    path.write_text(text)
    status = main(
        ["run", str(path), "--invoke", "main", "--device", "cpu", "--offload", "always", "--report", "text"]
    )
    out, err = capsys.readouterr()
    assert status == 0 and out.strip() == str(wasmtime_main(wasmtime.wat2wasm(text))), err
    assert "nothing offloaded: the module uses the memory64 proposal (a 64-bit memory at offset 0x" in err, (
        err
    )
    assert "ran " not in err


@pytest.mark.parametrize("proposal", sorted(CASES))
@pytest.mark.parametrize("command", ["inspect", "compile", "invoke"])
def test_inspect_compile_and_invoke_still_refuse_by_name_and_offset(
    proposal: str, command: str, tmp_path, capsys
) -> None:
    path = tmp_path / "m.wat"
    path.write_text(module_text(proposal))
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"func": "main", "args": []}\n')
    argv = {
        "inspect": ["inspect", str(path)],
        "compile": ["compile", str(path), "-o", str(tmp_path / "out"), "--target", "sm_90"],
        "invoke": ["invoke", str(path), "--backend", "cpu", "--calls", str(calls)],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    name = "multi-memory" if proposal == "multi-memory" else f"{proposal} proposal"
    # The first use: the tag section (exceptions), else $odd's body.
    where = "at offset 0x" if proposal == "exception handling" else "at function 1, offset 0x"
    assert name in err and where in err and len(err.strip().splitlines()) == 1, err
