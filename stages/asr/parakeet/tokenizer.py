"""Token ids → text and timed words, from the checkpoint's SentencePiece model.

"▁" starts a word. When a checkpoint has no tokenizer artifact the piece list from the config
(``labels`` or ``joint.vocabulary``) does the same job for plain BPE pieces.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent.errors import require
from stages.asr.backend import Word
from stages.asr.parakeet.dims import CheckpointError

WORD_START = "\u2581"


class PieceTokenizer:
    """Decodes ids with SentencePiece when its model is given, else by joining pieces."""

    def __init__(self, pieces: Sequence[str], sentencepiece_model: bytes | None = None) -> None:
        self._sp = None
        if sentencepiece_model is not None:
            spm = require("sentencepiece", what="the Parakeet tokenizer", extra="parakeet")
            self._sp = spm.SentencePieceProcessor(model_proto=sentencepiece_model)
            pieces = [self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())]
        if not pieces:
            raise CheckpointError("the checkpoint has neither a tokenizer model nor a labels list")
        self.pieces = list(pieces)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def text(self, ids: Sequence[int]) -> str:
        if self._sp is not None:
            return self._sp.decode(list(ids))
        return "".join(self.pieces[i] for i in ids).replace(WORD_START, " ").strip()

    def words(
        self, ids: Sequence[int], starts: Sequence[float], ends: Sequence[float]
    ) -> tuple[Word, ...]:
        """Group tokens into words at each "▁"; a word spans its first token's start to its last
        token's end."""
        groups: list[list[int]] = []
        for pos, i in enumerate(ids):
            if not groups or self.pieces[i].startswith(WORD_START):
                groups.append([])
            groups[-1].append(pos)
        words = []
        for group in groups:
            text = self.text([ids[p] for p in group]).strip()
            if text:
                words.append(Word(text=text, start=starts[group[0]], end=ends[group[-1]]))
        return tuple(words)
