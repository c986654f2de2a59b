#!/bin/sh
# veris sandbox boot (DESIGN §4, §5, §10). Run as root, once, before the
# workload starts:
#   1. a proxy user (uid 14741 by default) and the state dir it owns;
#   2. the CA and trust material (`veris ca init`), and the CA published into
#      the system trust store, so clients that use the system store trust it;
#   3. a stale nftables table from a veris that died is removed;
#   4. veris started as root with --install-redirect: it installs the rules
#      of deploy/veris.nft (every TCP port of other uids to veris, UDP 443 to
#      its silent QUIC sink, DNS only to the configured resolvers, every other
#      datagram dropped), watches them, writes the trust-only env file and the
#      ready file, and drops to the proxy uid. No proxy variables: the
#      redirect is the enforcement, and telling clients about a proxy would
#      hide a broken redirect.
#
# Usage: veris-boot.sh [start | prepare | exec CMD ARGS...]
#   start    steps 1-4, veris in the background, returns once it is ready
#   prepare  steps 1-3 only (systemd runs veris itself, see veris.service)
#   exec     start, then exec CMD with the env file applied (container entrypoint)
#
# Environment (defaults in brackets):
#   VERIS_BIN [/usr/local/bin/veris]   VERIS_STATE_DIR [/veris]
#   VERIS_PROXY_UID [14741]            VERIS_HTTPS_PORT [8443]   VERIS_HTTP_PORT [8081]
#   VERIS_ENV_FILE [$VERIS_STATE_DIR/env]
#   VERIS_QUIC_PORT [8443, UDP]        VERIS_ALLOW_QUIC [unset: UDP 443 to the sink]  VERIS_SYSTEM_TRUST [1: update the system store]
#   VERIS_SERVE_ARGS [empty: extra `veris serve` flags, e.g. "--twin URL --sandbox ID"]
#   VERIS_WORKLOAD_UID [unset: the uid the workload runs as, not 0 and not the proxy's; without
#                       it receipts say `unverified (workload may share the proxy uid)`]
set -eu

BIN=${VERIS_BIN:-/usr/local/bin/veris}
STATE=${VERIS_STATE_DIR:-/veris}
PROXY_UID=${VERIS_PROXY_UID:-14741}
HTTPS_PORT=${VERIS_HTTPS_PORT:-8443}
HTTP_PORT=${VERIS_HTTP_PORT:-8081}
QUIC_PORT=${VERIS_QUIC_PORT:-8443}
ENV_FILE=${VERIS_ENV_FILE:-$STATE/env}
READY=$STATE/ready.json
MODE=${1:-start}

say() { echo "veris-boot: $*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it installs nftables rules and the system CA). Next: run it as root, or with sudo"
[ "$PROXY_UID" != 0 ] || die "VERIS_PROXY_UID=0 would exempt every root process from the redirect. Next: pick a dedicated uid"
[ -x "$BIN" ] || die "no veris binary at $BIN. Next: set VERIS_BIN"
command -v nft >/dev/null || die "nft is not installed. Next: apt-get install nftables"

prepare() {
    # 1. The proxy user and its state dir.
    if ! getent passwd "$PROXY_UID" >/dev/null; then
        useradd --system --uid "$PROXY_UID" --user-group --no-create-home \
            --home-dir "$STATE" --shell /usr/sbin/nologin veris
    fi
    PROXY_GID=$(getent passwd "$PROXY_UID" | cut -d: -f4)
    install -d -m 0755 "$STATE"
    rm -f "$READY"

    # 2. CA and trust material, then hand the state to the proxy uid (the CA
    #    key stays 0600 in a 0700 dir; trust/ stays world-readable).
    "$BIN" ca init --state-dir "$STATE" >/dev/null
    chown -R "$PROXY_UID:$PROXY_GID" "$STATE"
    if [ "${VERIS_SYSTEM_TRUST:-1}" = 1 ]; then
        if command -v update-ca-certificates >/dev/null; then
            install -m 0644 "$STATE/trust/ca.pem" /usr/local/share/ca-certificates/veris.crt
            update-ca-certificates >/dev/null 2>&1
        elif command -v update-ca-trust >/dev/null; then
            install -m 0644 "$STATE/trust/ca.pem" /etc/pki/ca-trust/source/anchors/veris.pem
            update-ca-trust extract
        else
            say "no update-ca-certificates or update-ca-trust: the CA is not in the system store; clients need the env file"
        fi
    fi

    # 3. A table left by a veris that died (its rules fail closed until
    #    removed) is cleared; veris installs and watches its own (step 4).
    if nft list table inet veris >/dev/null 2>&1; then
        nft delete table inet veris
        say "removed a stale table inet veris"
    fi
}

start() {
    rm -f "$READY"
    # 4. veris, as root: it installs the redirect (every TCP port, QUIC to its
    #    sink, DNS to the configured resolvers only, other UDP dropped), starts
    #    the root helper that watches the rules, writes the env and ready
    #    files, then drops to the proxy uid. Word splitting of
    #    VERIS_SERVE_ARGS is wanted.
    quic=""
    [ -z "${VERIS_ALLOW_QUIC:-}" ] || quic="--allow-quic"
    workload=""
    [ -z "${VERIS_WORKLOAD_UID:-}" ] || workload="--workload-uid $VERIS_WORKLOAD_UID"
    # shellcheck disable=SC2086
    "$BIN" serve --transparent --install-redirect --proxy-uid "$PROXY_UID" $quic $workload \
        --https-listen "[::]:$HTTPS_PORT" --http-listen "[::]:$HTTP_PORT" \
        --quic-listen "[::]:$QUIC_PORT" \
        --state-dir "$STATE" --ready-file "$READY" \
        --write-env "$ENV_FILE" --env-trust-only ${VERIS_SERVE_ARGS:-} \
        </dev/null >>"$STATE/veris.log" 2>&1 &
    pid=$!
    # The ready file is written last, after the env file: bounded wait for it.
    i=0
    while [ ! -s "$READY" ]; do
        kill -0 "$pid" 2>/dev/null || die "veris exited during start; see $STATE/veris.log"
        i=$((i + 1))
        [ "$i" -le 300 ] || die "veris not ready after 30 s; see $STATE/veris.log"
        sleep 0.1
    done
    say "veris ready (pid $pid); env file $ENV_FILE; receipt: $BIN receipt --state-dir $STATE"
}

case "$MODE" in
    prepare) prepare ;;
    start) prepare; start ;;
    exec)
        shift
        [ "$#" -gt 0 ] || die "exec needs a command. Next: veris-boot.sh exec bash"
        prepare
        start
        set -a
        # shellcheck disable=SC1090
        . "$ENV_FILE"
        set +a
        exec "$@"
        ;;
    *) die "unknown mode '$MODE'. Next: veris-boot.sh start | prepare | exec CMD" ;;
esac
