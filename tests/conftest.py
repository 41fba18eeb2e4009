import os, shutil, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]

# Triton reads TRITON_INTERPRET when it decorates a kernel, and the xdist workers import every test module in one
# process: set it here, before any test module imports triton, so that kernels and their helpers are all interpreted
# on a machine without a GPU (tests that compile for sm_80/sm_90 do so in a subprocess without it).
if os.environ.get("TRITON_INTERPRET") is None and not os.path.exists("/dev/nvidia0"): os.environ["TRITON_INTERPRET"] = "1"


def rel(x, ref):
    "max |x - ref| / max |ref|, computed in the reference's dtype: the relative error the tests bound."
    return ((x.to(ref.dtype) - ref).abs().max() / (ref.abs().max() + 1e-30)).item()


def find_chromium():
    "A headless Chromium: $SSM_COURSE_CHROMIUM if set (empty: none), else Debian's chromium-headless-shell or chromium."
    if (env := os.environ.get("SSM_COURSE_CHROMIUM")) is not None: return shutil.which(env) if env else None
    for name in ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name): return path
    return None


CHROMIUM_INSTALL = "apt-get install chromium-headless-shell"
REQUIRE_BROWSER = "SSM_COURSE_REQUIRE_BROWSER"


def chromium_or_skip():
    """The headless Chromium for the browser checks. Without one the check is skipped, saying how to
    install it, unless `SSM_COURSE_REQUIRE_BROWSER=1` (set by `.ci/run`), where a missing browser fails."""
    if path := find_chromium(): return path
    msg = f"headless Chromium not found; install it with `{CHROMIUM_INSTALL}` (Debian/Ubuntu) to run the browser checks"
    if os.environ.get(REQUIRE_BROWSER, "") not in ("", "0"): pytest.fail(f"{msg} ({REQUIRE_BROWSER} is set)", pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="session")
def root(): return ROOT
