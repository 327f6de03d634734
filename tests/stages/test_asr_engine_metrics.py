"""What ``/metrics`` shows of the ASR engine, read back through prometheus-client: slots by
state, the batch-size and batch-wait histograms of the batches it really ran, and shed work."""

from __future__ import annotations

import asyncio

import numpy as np
from prom_text import samples
from test_asr_engine import Recording

from agent.metrics import Metrics, reason_label
from stages.asr.engine import ASREngine


def test_engine_samples_count_the_batches_it_ran():
    async def main():
        be = Recording(delay=0.01)
        eng = ASREngine(be, capacity=8, window_ms=30)
        slots = [eng.open() for _ in range(5)]
        # one batch of five, then one of two, then a lone request
        await asyncio.gather(*(eng.submit(s, np.zeros(160, np.float32)) for s in slots))
        await asyncio.gather(*(eng.submit(s, np.zeros(160, np.float32)) for s in slots[:2]))
        await eng.submit(slots[0], np.zeros(160, np.float32))
        eng.close_slot(slots[4])
        metrics = Metrics("asr-serve")
        metrics.add_source(eng.metric_samples)
        text = metrics.render()[0].decode()
        eng.close()
        return be, text

    be, text = asyncio.run(main())
    got = samples(text)
    assert [len(b) for b in be.batches] == [5, 2, 1]
    assert got[("voxline_asr_slots", (("state", "in_use"),))] == 4
    assert got[("voxline_asr_slots", (("state", "free"),))] == 4
    assert got[("voxline_asr_batches_total", ())] == 3
    assert got[("voxline_asr_requests_total", ())] == 8
    size = {le: got[("voxline_asr_batch_size_bucket", (("le", le),))]
            for le in ("1.0", "2.0", "5.0", "8.0", "+Inf")}
    assert size == {"1.0": 1, "2.0": 2, "5.0": 3, "8.0": 3, "+Inf": 3}
    assert got[("voxline_asr_batch_size_sum", ())] == 8
    # every request waited for its batch: ~the 30 ms window for the first two batches
    assert got[("voxline_asr_batch_wait_seconds_count", ())] == 8
    assert 0.1 < got[("voxline_asr_batch_wait_seconds_sum", ())] < 2.0
    assert got[("voxline_asr_batch_wait_seconds_bucket", (("le", "0.001"),))] == 0
    assert got[("voxline_asr_partials_shed_total", ())] == 0
    assert got[("voxline_asr_busy_seconds_total", ())] > 0.02


def test_end_reasons_become_few_label_values():
    assert reason_label("hangup") == "hangup"
    assert reason_label("rtp_timeout") == "rtp_timeout"
    assert reason_label("") == "other"
    assert reason_label("the caller said: bye now!") == "other"  # free text never a label
    assert reason_label("x" * 40) == "other"
