"""Tests of the framework integrations (each module skips when its framework is missing)."""
