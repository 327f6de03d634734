"""Symmetric RTP (RFC 4961) for one call, sans-I/O: which source the caller's packets are
taken from, and where ours go.

The rule, in full:

1. The offer's SDP names a host and a port. Only datagrams from that host are considered;
   any other source is dropped and counted, whatever it sends.
2. The first well-formed packet of a negotiated payload type from that host *latches* its
   source (host and port): from then on we send there and take packets only from there. A NAT
   between the caller and us may have rewritten the port, hence the latch rather than the SDP's
   port alone.
3. The exact host and port the SDP named always wins: a packet from it re-latches a latch
   that went elsewhere (another program on the caller's host that spoke first loses it).
4. Source port 0 from the latched host is accepted without latching: only a raw socket can
   send from port 0, and a raw socket can forge any source port anyway, so turning it away
   protects nothing (sipp replays its DTMF pcaps this way). We never send to port 0.

Until something latches we send to the SDP's host and port.
"""

from __future__ import annotations

Address = tuple[str, int]


class PeerLatch:
    """``admits(source)`` before a datagram is parsed; ``seen(source)`` once it proved to be
    one of the call's RTP packets; ``target`` is where the call's packets go."""

    def __init__(self, offered: Address) -> None:
        self.offered = offered
        self.latched: Address | None = None
        self.relatched = 0  # times rule 3 took the latch back

    @property
    def target(self) -> Address:
        return self.latched or self.offered

    def admits(self, source: Address) -> bool:
        host, port = source[0], source[1]
        if host != self.offered[0]:
            return False
        latched = self.latched
        return latched is None or port == 0 or port == latched[1] or port == self.offered[1]

    def seen(self, source: Address) -> bool:
        """Latch onto ``source`` if the rule says so; True when the source changed (a new
        stream: its sequence numbers and SSRC start over)."""
        source = (source[0], source[1])
        if source[1] == 0 or source == self.latched:
            return False
        if self.latched is None:
            self.latched = source
            return False
        if source == self.offered:
            self.latched = source
            self.relatched += 1
            return True
        return False
