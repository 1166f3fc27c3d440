"""Jinja templates for emitted kernels and build files (package data)."""
