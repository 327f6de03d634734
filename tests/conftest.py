"""Suite-wide: puts ``tests/`` on the import path (``import speech``) and says in the header
when the speech inputs are perturbed."""

import os

from speech import PERTURB_ENV


def pytest_report_header(config):
    how = os.environ.get(PERTURB_ENV)
    return [f"speech inputs perturbed: {PERTURB_ENV}={how}"] if how else []
