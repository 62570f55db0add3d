"""tensorwasm.instantiate page-locks linear memory for the copies (as ``tensorwasm run``
does), and unlocks it when the instance goes, while its store still maps that memory: the
store is held until then, whichever of the two the program drops first."""

from __future__ import annotations

import gc
import weakref

import pytest
import wasmtime

import tensorwasm
from tensorwasm.runtime import api
from tensorwasm.runtime.offload import OffloadModule
from tests.runtime.test_api import MODULE, imports, run


def _closing_records(monkeypatch) -> list[bool]:
    """For each close of an offload module: whether its store was still alive."""
    seen: list[bool] = []
    real = OffloadModule.close

    def close(self) -> None:
        alive = [ref() for ref in STORES.get(id(self), [])]
        seen.append(
            bool(alive) and all(store is not None and store._context() is not None for store in alive)
        )
        real(self)

    monkeypatch.setattr(OffloadModule, "close", close)
    return seen


STORES: dict[int, list[weakref.ref]] = {}


def _instance(**options):
    store = wasmtime.Store(wasmtime.Engine())
    _, externs = imports(store, [])
    instance = tensorwasm.instantiate(store, MODULE, externs, device="cpu", offload="always", **options)
    prepared = api._PREPARED[instance]
    STORES[id(prepared)] = [weakref.ref(store)]
    instance.exports(store)["scale"](store, 64, 100, 2.0)
    return store, instance, prepared


@pytest.mark.parametrize("pin", [True, False])
def test_the_pin_is_requested_unless_declined(pin: bool) -> None:
    _, _, prepared = _instance(**({} if pin else {"pin": False}))
    assert prepared.pin is pin


@pytest.mark.parametrize("first", ["store", "instance", "report's hold"])
def test_the_module_is_closed_while_its_store_lives_and_the_store_then_goes(first: str, monkeypatch) -> None:
    closed = _closing_records(monkeypatch)
    store, instance, prepared = _instance()
    store_ref = weakref.ref(store)
    del prepared
    if first == "report's hold":  # the report's table lets go of the store first: the pin must not rely on it
        api._STORES.pop(instance)
        del store
        gc.collect()
        del instance
    elif first == "store":
        del store
        gc.collect()
        assert store_ref() is not None and closed == []  # the instance needs it: kept
        del instance
    else:
        del instance
        gc.collect()
        del store
    gc.collect()
    assert closed == [True]
    assert store_ref() is None  # held only until the module was closed


@pytest.mark.gpu
def test_the_gpu_copies_from_page_locked_memory_and_unpins_when_the_instance_goes() -> None:
    expected, _, _ = run(
        lambda store, ext: wasmtime.Instance(store, wasmtime.Module(store.engine, MODULE), ext)
    )
    got, _, instance = run(
        lambda store, ext: tensorwasm.instantiate(store, MODULE, ext, device="gpu", offload="always")
    )
    assert got == expected
    (loop,) = tensorwasm.report(instance).loops
    assert loop.offloaded == 2 and loop.pinned
    prepared = api._PREPARED[instance]
    assert prepared.mirror is not None and prepared.mirror.pinned is not None
    del instance
    gc.collect()
    assert prepared.mirror is None or prepared.mirror.pinned is None
    # A new store, perhaps mapped where the last one was, is copied from its own pages.
    again, _, _ = run(
        lambda store, ext: tensorwasm.instantiate(store, MODULE, ext, device="gpu", offload="always")
    )
    assert again == expected
