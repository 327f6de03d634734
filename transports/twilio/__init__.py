"""Twilio Media Streams: a bidirectional ``<Connect><Stream>`` call over a WebSocket, carrying
8 kHz μ-law audio as base64 inside JSON messages."""
