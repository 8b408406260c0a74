#!/usr/bin/env bash
# Installs Debian's chromium for the browser test (tests/test_browser.py), once.
# Idempotent: does nothing when /usr/bin/chromium exists. Needs root and apt-get;
# without them it says so and exits 0, and the browser test then fails under CI=1
# (and is skipped, naming this script, on a developer machine).
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "chromium: no apt-get on this machine; install Chromium as /usr/bin/chromium" >&2
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "chromium: run as root (or: sudo apt-get install -y chromium)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
/usr/bin/chromium --version
