"""Emulated SGLang version (rewritten by build_wheel.py)."""

__version__ = "0.5.11+simulator"
