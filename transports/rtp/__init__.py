"""RTP (RFC 3550) for telephone calls: packets, a jitter buffer, RFC 4733 DTMF, and the asyncio
media stream that ties them to a session."""
