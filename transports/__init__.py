"""Transports: how a call's audio enters and leaves (file, WebSocket, WebRTC, Twilio, SIP)."""
