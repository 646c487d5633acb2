#!/usr/bin/env python3
"""Render an HTML audit report in headless Chromium and save a PNG screenshot.

    python scripts/screenshot_html.py report.html shot.png [--width 1280] [--height 4000]

Exit 0 with the screenshot written, 2 on bad input, 4 if no Chromium binary is found.  Used
to check that the self-contained report renders (plots included) without a network.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    for b in BINARIES:
        p = shutil.which(b)
        if p:
            return p
    return None


def screenshot(html_path: str, png_path: str, *, width: int = 1280, height: int = 4000,
               timeout: float = 120.0) -> None:
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium binary (apt-get install -y chromium)")
    url = "file://" + os.path.abspath(html_path)
    with tempfile.TemporaryDirectory(prefix="fa4verify-chromium-") as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={width},{height}",
               f"--screenshot={os.path.abspath(png_path)}", url]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not os.path.exists(png_path) or os.path.getsize(png_path) == 0:
        raise RuntimeError(f"chromium failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html")
    ap.add_argument("png")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=4000)
    a = ap.parse_args(argv)
    if not os.path.isfile(a.html):
        print(f"screenshot_html: {a.html}: no such file", file=sys.stderr)
        return 2
    try:
        screenshot(a.html, a.png, width=a.width, height=a.height)
    except FileNotFoundError as e:
        print(f"screenshot_html: {e}", file=sys.stderr)
        return 4
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"screenshot_html: {e}", file=sys.stderr)
        return 1
    print(f"screenshot_html: wrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
