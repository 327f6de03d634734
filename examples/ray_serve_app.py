"""voxline on Ray Serve, as a ``serve run`` application: voice replicas (each with the models
and its own media server) behind an ingress that serves the page and places each call.

    pip install 'voxline[ray]'
    ray start --head                          # or join an existing cluster
    serve run examples.ray_serve_app:app      # then open http://127.0.0.1:8000/ and press Call

    # or with arguments (a builder): replicas fixed at 2, 8 calls each, media on loopback
    serve run examples.ray_serve_app:build replicas=2 max_calls=8 media_host=127.0.0.1

Calls' media never passes through Serve's HTTP proxy: ``POST /place`` answers the chosen
replica's own WebSocket (and WebRTC ``/offer``) address, so each replica's port must be
reachable from callers (the replica binds its node's IP unless ``media_host`` says otherwise),
and the page's origin must be allowed there (``allowed_origins``, default: Serve's
http://127.0.0.1:8000 and http://localhost:8000). Without ``replicas`` it autoscales on active
calls; a replica that goes (scale-down, redeploy, ``serve shutdown``) drains first: no new call,
live calls finish within ``drain_timeout_s`` (Serve's ``graceful_shutdown_timeout_s`` is set
above it). ``voxline serve --ray`` runs the same application from the CLI.
"""

from __future__ import annotations

from typing import Any

from agent.commands.ray_serve import ScaleOptions, voice_app

ORIGINS = ("http://127.0.0.1:8000", "http://localhost:8000")


def build(args: dict[str, Any]) -> Any:
    """``serve run examples.ray_serve_app:build key=value ...``: config=FILE.toml (voxline's
    configuration), token, max_calls, replicas, min_replicas, max_replicas, media_host,
    allow_origin (comma-separated), drain_timeout_s."""
    from agent.config import Config, load_toml

    cfg = load_toml(args["config"]) if args.get("config") else Config()
    origins = [o for o in str(args.get("allow_origin", "")).split(",") if o]
    return voice_app(ScaleOptions(
        cfg=cfg, token=str(args.get("token", "")),
        max_calls=int(args.get("max_calls", 16)), replicas=int(args.get("replicas", 0)),
        min_replicas=int(args.get("min_replicas", 1)), max_replicas=int(args.get("max_replicas", 4)),
        media_host=str(args.get("media_host", "")), allowed_origins=[*ORIGINS, *origins],
        drain_timeout_s=float(args.get("drain_timeout_s", 60.0))))


app = build({})
