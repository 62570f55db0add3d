"""Tests of tensorwasm.compiler."""
