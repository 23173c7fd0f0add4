"""Reducers: tensor histories fed by monitors (inferno-compatible)."""

__all__ = []
