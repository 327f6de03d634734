"""The browser protocol on one WebSocket: binary PCM16 audio both ways, JSON events as text."""
