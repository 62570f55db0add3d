"""Tests of tensorwasm.runtime."""
