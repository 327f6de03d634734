"""The browser call over WebRTC (aiortc): Opus audio both ways, JSON events on a data channel."""
