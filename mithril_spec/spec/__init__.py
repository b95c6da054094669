"""Pydantic models of the spec language (one module per section; the whole spec in `root`)."""
