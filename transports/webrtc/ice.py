"""ICE set-up for a server that must not reach beyond its host: no public STUN server by
default, and loopback-only candidates when the server is bound to loopback."""

from __future__ import annotations

from collections.abc import Sequence

from aiortc import RTCConfiguration, RTCIceServer

LOOPBACK = "127.0.0.1"


def rtc_configuration(ice_servers: Sequence[str] = ()) -> RTCConfiguration:
    """aiortc's default adds stun.l.google.com; an empty list keeps ICE on host candidates."""
    return RTCConfiguration(iceServers=[RTCIceServer(urls=url) for url in ice_servers])


def use_loopback_ice() -> None:
    """Make aioice gather 127.0.0.1, which it otherwise always skips.

    Process-wide (aioice reads the function at gathering time); only for a server bound to
    loopback, where no client can come from elsewhere. Without it, in a network namespace with
    only ``lo`` aioice gathers nothing and ICE waits forever without an error.
    """
    import aioice.ice

    def loopback_addresses(use_ipv4: bool = True, use_ipv6: bool = True) -> list[str]:
        return [LOOPBACK]

    aioice.ice.get_host_addresses = loopback_addresses


def keep_loopback_candidates(sdp: str) -> str:
    """Drop every ``a=candidate`` line that is not on 127.0.0.1 (a browser on the same host
    offers all its interfaces; on a loopback server only 127.0.0.1 can answer)."""
    lines = sdp.split("\r\n")
    return "\r\n".join(
        ln for ln in lines if not ln.startswith("a=candidate") or f" {LOOPBACK} " in ln
    )
