"""Text to speech: the backend interface, Piper and eSpeak NG backends, and the TTS stage."""
