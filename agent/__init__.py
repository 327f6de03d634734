"""voxline core: frames, stages, the pipeline graph, sessions, latency tracing and the CLI."""

__version__ = "0.1.0"
