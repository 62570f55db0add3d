"""Tests of tensorwasm.support."""
