"""Test support code shared by the test areas (importable as `support`)."""
