"""Pipeline stages: VAD, ASR (the engine and its backends), turn detection, LLM and TTS."""
