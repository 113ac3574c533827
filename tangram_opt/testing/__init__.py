"""Test oracles."""
