import os, shutil, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]


def find_chromium():
    "A headless Chromium: Debian's chromium-headless-shell or chromium."
    for name in ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name): return path
    return None


@pytest.fixture(scope="session")
def root(): return ROOT
