"""The official ``openai`` SDK against asr-serve's transcription endpoint, with the token the
endpoint now asks for: json, text, verbose_json and stream (skipped where the SDK is absent)."""

import asyncio
import io
import threading

import pytest
import soundfile
import speech

from agent.config import ASRConfig
from stages.asr.engine import ASREngine
from stages.asr.server import ASRServer
from stages.asr.wer import wer
from transports.auth import TokenAuth

openai = pytest.importorskip("openai")


def test_the_openai_sdk_transcribes_in_every_format_with_the_token(tmp_path):
    from stages.asr.whisper import WhisperBackend

    backend = WhisperBackend(ASRConfig())
    backend.warmup()
    buf = io.BytesIO()
    soundfile.write(buf, speech.load("kittens"), 16000, format="WAV", subtype="PCM_16")
    clip = buf.getvalue()
    started = threading.Event()
    stop: dict = {}

    def serve() -> None:
        async def main():
            engine = ASREngine(backend, capacity=4)
            server = ASRServer(engine)
            await server.start_unix(str(tmp_path / "asr.sock"))
            stop["port"] = await server.start_http("127.0.0.1", 0, token_check=TokenAuth("sdk-key"))
            stop["event"] = asyncio.Event()
            stop["loop"] = asyncio.get_running_loop()
            started.set()
            await stop["event"].wait()
            await server.close()
            engine.close()

        asyncio.run(main())

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        assert started.wait(60)
        base = f"http://127.0.0.1:{stop['port']}/v1"
        client = openai.OpenAI(base_url=base, api_key="sdk-key", max_retries=0)
        as_json = client.audio.transcriptions.create(model="whisper-1", file=("k.wav", clip))
        as_text = client.audio.transcriptions.create(model="whisper-1", file=("k.wav", clip),
                                                     response_format="text")
        verbose = client.audio.transcriptions.create(model="whisper-1", file=("k.wav", clip),
                                                     response_format="verbose_json")
        events = list(client.audio.transcriptions.create(model="whisper-1", file=("k.wav", clip),
                                                         stream=True))
        wrong = openai.OpenAI(base_url=base, api_key="not-it", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.audio.transcriptions.create(model="whisper-1", file=("k.wav", clip))
    finally:
        if "loop" in stop:
            stop["loop"].call_soon_threadsafe(stop["event"].set)
        thread.join(60)
    reference = speech.text("kittens")
    assert wer(reference, as_json.text) <= 0.15, as_json.text
    assert str(as_text).strip() == as_json.text
    assert verbose.text == as_json.text and verbose.duration == pytest.approx(3.32, abs=0.01)
    assert [e.type for e in events] == ["transcript.text.delta", "transcript.text.done"]
    assert events[-1].text == as_json.text
