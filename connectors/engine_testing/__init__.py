"""Test-only helpers shared by the connectors' engine tests (never shipped)."""
