"""Tests of tensorwasm.dialect."""
