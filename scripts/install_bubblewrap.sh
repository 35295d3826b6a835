#!/usr/bin/env bash
# bubblewrap: the sandbox `cacheon verify` runs candidate code in (Debian package `bubblewrap`).
# Skips when a working bwrap is already on PATH; uses sudo only when not root.
set -euo pipefail
works() { command -v bwrap >/dev/null 2>&1 && bwrap --unshare-all --die-with-parent --ro-bind / / true >/dev/null 2>&1; }
if works; then
  echo "install_bubblewrap: $(bwrap --version) ready"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install_bubblewrap: no apt-get here; install the bubblewrap package with this system's package manager" >&2
  exit 1
fi
$SUDO apt-get install -y -q bubblewrap >/dev/null 2>&1 || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q bubblewrap >/dev/null; }
if ! works; then
  echo "install_bubblewrap: bwrap is installed but cannot create namespaces here (user namespaces disabled?)" >&2
  exit 1
fi
echo "install_bubblewrap: $(bwrap --version) ready"
