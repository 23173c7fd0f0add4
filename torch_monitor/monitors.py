"""Monitors: module hooks that feed reducers (inferno-compatible)."""

__all__ = []
