# shellcheck shell=bash disable=SC2034 # variables for the scripts that source this
# Shared helpers for scripts/*. Source it; it does nothing by itself.
#
# Everything the scripts say goes to stderr, so that `scripts/pycell run --json`
# keeps a clean stdout.

PYCELL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYCELL_CACHE="$PYCELL_ROOT/.cache"
PYCELL_TOOLS_VENV="$PYCELL_CACHE/tools"
PYCELL_TARGET_DIR="${CARGO_TARGET_DIR:-$PYCELL_ROOT/target}"
# Debian's interpreter: the one the default policy runs, and the one the
# scripts use (never whatever python3 comes first on PATH, e.g. pyenv's).
HOST_PYTHON=/usr/bin/python3
MIN_RUST=1.88

# The sandbox uid must be able to read what we build for it (venvs).
umask 022

# Package registries may sit behind a TLS-intercepting proxy whose CA is only in
# the system store; uv (rustls) and pip (certifi) ignore that store unless told.
if [[ -r /etc/ssl/certs/ca-certificates.crt ]]; then
    export SSL_CERT_FILE="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}"
    export PIP_CERT="${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}"
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
# uv must use host interpreters; it cannot (and should not) download any.
export UV_PYTHON_DOWNLOADS=never
export UV_CACHE_DIR="${UV_CACHE_DIR:-$PYCELL_CACHE/uv}"

say() { printf '%s\n' "$*" >&2; }
die() { printf '%s: error: %s\n' "${PYCELL_SCRIPT:-pycell}" "$*" >&2; exit 1; }

# need_root REASON [SCRIPT_ARGS...]
need_root() {
    if [[ $EUID -ne 0 ]]; then
        local reason=$1
        shift
        die "must run as root: $reason
  try: sudo $0${*:+ $*}"
    fi
}

# Run a command with its output in a log; show the log only if it fails.
quietly() {
    local log
    log=$(mktemp)
    if "$@" >"$log" 2>&1; then
        rm -f "$log"
    else
        local rc=$?
        say "--- output of: $* ---"
        cat "$log" >&2
        rm -f "$log"
        return "$rc"
    fi
}

# Put cargo on PATH. Under sudo, PATH is reset and HOME is root's, so also
# look in the invoking user's ~/.cargo (rustup's default install).
find_cargo() {
    if command -v cargo >/dev/null 2>&1; then
        return 0
    fi
    local home
    for home in "$HOME" ${SUDO_USER:+"$(getent passwd "$SUDO_USER" | cut -d: -f6)"}; do
        if [[ -x "$home/.cargo/bin/cargo" ]]; then
            export PATH="$home/.cargo/bin:$PATH"
            # rustup's proxies find toolchains through RUSTUP_HOME.
            if [[ -d "$home/.rustup" && -z "${RUSTUP_HOME:-}" ]]; then
                export RUSTUP_HOME="$home/.rustup"
            fi
            return 0
        fi
    done
    return 1
}

# "1.85.0" >= "1.85" ?
version_ge() {
    [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}

cargo_build_flags() {
    # In CI the committed Cargo.lock must be complete and current.
    if [[ "${CI:-}" == true ]]; then
        printf '%s\n' --locked
    fi
}
