#!/usr/bin/env bash
# The system packages Cacheon's real tiers need, installed only where missing (apt; sudo only when not root):
#   bubblewrap                  the sandbox `cacheon verify` runs candidate code in (it must create namespaces;
#                               0.8 or later, for --disable-userns/--assert-userns-disabled)
#   python3-seccomp             libseccomp's binding, in the system python3: it compiles the sandbox's seccomp filter
#   util-linux (nsenter)        as root, the verifier disables nested user namespaces in the sandbox with it
#   g++, ninja-build, libssl-dev  SGLang's native block-hash extension (mem_cache/cpp_utils/hash_binding.cpp),
#                               built inside the CPU-engine tier's server venvs for releases from 0.5.18 on
#   chromium                    the headless browser the gateway dashboard's test drives through Playwright
#                               (tests/gateway/test_gateway_dashboard.py; Playwright's own browser download is not used)
set -euo pipefail
bwrap_works() { command -v bwrap >/dev/null 2>&1 && bwrap --unshare-all --die-with-parent --ro-bind / / true >/dev/null 2>&1; }

missing=()
bwrap_works || missing+=(bubblewrap)
/usr/bin/python3 -c 'import seccomp' >/dev/null 2>&1 || missing+=(python3-seccomp)
command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
[ -f /usr/include/openssl/sha.h ] || missing+=(libssl-dev)
[ -x /usr/bin/chromium ] || missing+=(chromium)

if [ "${#missing[@]}" -gt 0 ]; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "install_system_packages: no apt-get here; install ${missing[*]} with this system's package manager" >&2
        exit 1
    fi
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "install_system_packages: installing ${missing[*]}"
    $SUDO apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
        || { $SUDO apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}" >/dev/null; }
fi
if ! bwrap_works; then
    echo "install_system_packages: bwrap is installed but cannot create namespaces here (user namespaces disabled?)" >&2
    exit 1
fi
# The help text whole, then matched: `bwrap --help | grep -q` under pipefail fails when grep exits first (SIGPIPE).
if ! grep -q -- --assert-userns-disabled <<<"$(bwrap --help 2>&1)"; then
    echo "install_system_packages: $(bwrap --version) lacks --disable-userns/--assert-userns-disabled (0.8 or later is needed)" >&2
    exit 1
fi
case "$(uname -m)" in
    x86_64|aarch64) ;;
    *) echo "install_system_packages: the sandbox's seccomp policy covers x86_64 and aarch64 only, not $(uname -m)" >&2; exit 1 ;;
esac
echo "install_system_packages: ready ($(bwrap --version), $(g++ --version | head -n1))"
