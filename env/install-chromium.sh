#!/usr/bin/env bash
# The system chromium that figure export (kaleido) and the browser test (Playwright) drive.
# apt only: a browser is never downloaded through pip, kaleido or playwright.
#   - already there ($BROWSER_PATH, /usr/bin/chromium, chromium on PATH): nothing to do
#   - apt-get present and root (or password-less sudo): apt-get install chromium; a failure is an error
#   - no apt-get, or no way to become root: skip with a message (static export and the browser test need it)
set -euo pipefail

find_browser() {
  local b
  for b in "${BROWSER_PATH:-}" /usr/bin/chromium /usr/bin/chromium-browser "$(command -v chromium 2>/dev/null || true)"; do
    if [ -n "$b" ] && [ -x "$b" ]; then echo "$b"; return 0; fi
  done
  return 1
}

if b=$(find_browser); then
  echo "chromium: $b"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "chromium: not installed and this machine has no apt-get: skipping."
  echo "          Install chromium with your package manager (or set BROWSER_PATH) for PNG/SVG/PDF export and the browser test."
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "chromium: apt-get needs root and sudo asks for a password: skipping. Run: sudo apt-get install -y chromium"
    exit 0
  fi
fi
export DEBIAN_FRONTEND=noninteractive
echo "chromium: installing with apt-get (Debian's chromium package)"
$SUDO apt-get update -qq || echo "chromium: apt-get update failed; trying the install with the current package lists"
$SUDO apt-get install -y -qq chromium >/dev/null
if b=$(find_browser); then
  echo "chromium: $b"
else
  echo "chromium: apt-get install chromium finished but no chromium binary was found" >&2
  exit 1
fi
