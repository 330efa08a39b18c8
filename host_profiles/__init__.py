"""Shipped host profiles (YAML); loaded by tuner.profiles."""
