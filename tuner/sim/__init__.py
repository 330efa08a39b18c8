"""Simulated host: a folder that holds a whole machine (see docs/INTERNALS.md)."""
