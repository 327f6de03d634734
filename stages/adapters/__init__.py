"""Adapters that put voxline's stages inside other voice frameworks (each behind its own extra)."""
