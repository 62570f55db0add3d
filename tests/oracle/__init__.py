"""Tests of tensorwasm.oracle."""
